package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on every Linux the tests run on).
const clockTick = 10 * time.Millisecond

// ProcessCPU is the CPU time (user and system) process pid has used so far.
func ProcessCPU(pid int) (time.Duration, error) {
	_, cpu, err := readStat(fmt.Sprintf("/proc/%d/stat", pid))
	return cpu, err
}

// ProcessGroupCPU is the CPU time (user and system) the live processes of process group pgid
// have used so far (a kube-apiserver started through a wrapper is one such group).
func ProcessGroupCPU(pgid int) (time.Duration, error) {
	paths, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	var total time.Duration
	found := false
	for _, p := range paths {
		group, cpu, err := readStat(p)
		if err != nil || group != pgid {
			continue // gone since the glob, or another group
		}
		total += cpu
		found = true
	}
	if !found {
		return 0, fmt.Errorf("no process in group %d", pgid)
	}
	return total, nil
}

// readStat reads a /proc/<pid>/stat line: its process group and utime+stime (proc(5)).
func readStat(path string) (pgrp int, cpu time.Duration, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces or parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("%s: no command name", path)
	}
	fields := strings.Fields(s[i+1:]) // from field 3, state
	if len(fields) < 13 {
		return 0, 0, fmt.Errorf("%s: %d fields", path, len(fields)+2)
	}
	pgrp, err = strconv.Atoi(fields[2]) // field 5
	if err != nil {
		return 0, 0, fmt.Errorf("%s: pgrp: %w", path, err)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(fields[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("%s: utime %v, stime %v", path, err1, err2)
	}
	return pgrp, time.Duration(utime+stime) * clockTick, nil
}
