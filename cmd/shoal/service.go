package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"

	"shoal/internal/sdnotify"
	"shoal/node"
)

// notifyService tells a service manager (systemd's Type=notify) when the
// agent is ready, and pings its watchdog while the agent runs.
func notifyService(ctx context.Context, a *node.Agent) {
	select {
	case <-a.Ready():
	case <-ctx.Done():
		return
	case <-a.Done():
		return
	}
	if sent, err := sdnotify.Notify(sdnotify.Ready + "\nSTATUS=serving, node " + a.Name()); err != nil {
		zap.L().Warn("sd_notify READY", zap.Error(err))
	} else if sent {
		zap.L().Info("told the service manager: ready")
	}
	every, err := sdnotify.WatchdogInterval()
	if err != nil {
		zap.L().Warn("systemd watchdog", zap.Error(err))
	}
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.Done():
			return
		case <-t.C:
			if _, err := sdnotify.Notify(sdnotify.Watchdog); err != nil {
				zap.L().Warn("sd_notify WATCHDOG", zap.Error(err))
			}
		}
	}
}

// drainAndLeave is the agent's answer to SIGTERM: refuse new requests,
// let those in flight finish up to timeout, leave Raft and gossip cleanly.
func drainAndLeave(a *node.Agent, timeout time.Duration, stderr io.Writer) error {
	if _, err := sdnotify.Notify(sdnotify.Stopping + "\nSTATUS=draining"); err != nil {
		zap.L().Warn("sd_notify STOPPING", zap.Error(err))
	}
	n := a.InFlight()
	fmt.Fprintf(stderr, "draining: %d request(s) in flight, waiting up to %s (a second signal stops at once)\n", n, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	left := a.Drain(ctx)
	cancel()
	if left > 0 {
		fmt.Fprintf(stderr, "drain deadline: %d request(s) still running end now\n", left)
	}
	err := a.Shutdown(true)
	fmt.Fprintln(stderr, "left the cluster; stopped")
	return err
}
