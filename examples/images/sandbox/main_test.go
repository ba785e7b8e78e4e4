package main

import "testing"

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"unknown", []string{"shell"}, 2},
		{"fetch without URL", []string{"fetch"}, 2},
		{"fetch with two", []string{"fetch", "http://a", "http://b"}, 2},
		{"version with an argument", []string{"version", "x"}, 2},
		{"fetch of nothing", []string{"fetch", "http://127.0.0.1:0/"}, 1},
		{"help", []string{"help"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := run(tc.args); got != tc.want {
				t.Errorf("run(%q) = %d, want %d", tc.args, got, tc.want)
			}
		})
	}
}
