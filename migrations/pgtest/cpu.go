package pgtest

import (
	"os"
	"strconv"
	"strings"
)

// BusyCPU is the CPU time, in seconds, the machine has spent working since
// it started (/proc/stat's user, nice, system, irq and softirq: not idle or
// iowait, not time the hypervisor stole, not guests', which user holds
// already), or 0 where there is no /proc/stat. Benchmarks read it before
// and after what they measure beside its baseline: the work each did,
// which waiting for a core shared with another virtual machine does not
// lengthen as it lengthens the time. Every process of the machine counts
// (the node, PostgreSQL): nothing else of note runs during a benchmark.
func BusyCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for _, i := range []int{1, 2, 3, 6, 7} {
		ticks, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return 0
		}
		busy += ticks
	}
	return busy / clockTicks
}

// ProcessCPU is the CPU time, in seconds, process pid has used (user and
// system, from /proc/pid/stat; 0 for this process), or 0 where there is
// none.
func ProcessCPU(pid int) float64 {
	name := "self"
	if pid != 0 {
		name = strconv.Itoa(pid)
	}
	b, err := os.ReadFile("/proc/" + name + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command name (in parentheses, which may hold
	// any character): utime and stime are the 12th and 13th.
	i := strings.LastIndex(string(b), ") ")
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 13 {
		return 0
	}
	user, err1 := strconv.ParseFloat(f[11], 64)
	system, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return (user + system) / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every
// Linux architecture Go runs on.
const clockTicks = 100
