// Package sdnotify speaks systemd's service notification protocol: a
// service started with Type=notify sends READY=1 once it serves,
// STOPPING=1 when it begins to stop and WATCHDOG=1 within WatchdogSec, as
// datagrams to the unix socket named by NOTIFY_SOCKET. Without that
// variable (not under systemd, or on macOS) every call does nothing. It
// must not import other shoal packages.
package sdnotify
