package testkit

import (
	"os"
	"runtime"
	"strconv"
	"strings"
)

// GoMemory is the heap and stack memory the Go runtime has in use, in
// bytes: what memory benchmarks count per connection.
func GoMemory() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// RSS returns the process's resident set size in bytes (0 where
// /proc/self/status cannot tell).
func RSS() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.Fields(v)[0], 10, 64)
			return kb * 1024
		}
	}
	return 0
}
