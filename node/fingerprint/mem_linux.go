package fingerprint

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memInfo returns total and available memory in bytes: the machine's, or
// less when the agent's cgroup (a container's memory limit, a systemd
// MemoryMax) allows less, so a container is not offered the host's memory.
func memInfo() (total, free uint64) {
	total, free = procMemInfo("/proc/meminfo")
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return total, free
	}
	if limit, usage, ok := cgroupMemory("/sys/fs/cgroup", string(cg)); ok && limit < total {
		total = limit
		avail := uint64(0)
		if usage < limit {
			avail = limit - usage
		}
		free = min(free, avail)
	}
	return total, free
}

func procMemInfo(path string) (total, free uint64) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "MemTotal:":
			total = v * 1024
		case "MemAvailable:":
			free = v * 1024
		}
	}
	return total, free
}

// cgroupMemory finds the memory limit of the cgroup that selfCgroup (the
// text of /proc/self/cgroup) names under root, the least of it and its
// parents' (cgroup v2: memory.max; v1: memory.limit_in_bytes), and the
// usage of the cgroup that sets it. ok is false when no limit is set.
func cgroupMemory(root, selfCgroup string) (limit, usage uint64, ok bool) {
	for _, line := range strings.Split(strings.TrimSpace(selfCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var base, limitFile, usageFile string
		switch {
		case parts[0] == "0" && parts[1] == "": // v2
			base, limitFile, usageFile = root, "memory.max", "memory.current"
		case hasController(parts[1], "memory"): // v1
			base, limitFile, usageFile = filepath.Join(root, "memory"), "memory.limit_in_bytes", "memory.usage_in_bytes"
		default:
			continue
		}
		// In a container the cgroup's own path is often not mounted (the
		// namespace's root is): try the path, then each parent, to root.
		for dir := filepath.Join(base, parts[2]); ; dir = filepath.Dir(dir) {
			if l, err := readCgroupValue(filepath.Join(dir, limitFile)); err == nil && l > 0 && l < 1<<62 && (!ok || l < limit) {
				limit, ok = l, true
				usage, _ = readCgroupValue(filepath.Join(dir, usageFile))
			}
			if len(dir) <= len(base) {
				break
			}
		}
		if ok {
			return limit, usage, true
		}
	}
	return 0, 0, false
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// readCgroupValue reads a number of bytes; "max" (no limit) reads as 0.
func readCgroupValue(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}
