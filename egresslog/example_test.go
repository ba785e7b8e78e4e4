package egresslog_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agenthold/egress/egresslog"
)

func ExampleLog() {
	l := &egresslog.Log{Keep: 100, Sinks: []egresslog.Sink{egresslog.NewJSONSink(os.Stdout)}}
	t := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	l.Record(egresslog.Record{Time: t, Agent: "a1", Kind: egresslog.KindDNS, Host: "exfil.evil.example", Method: "TXT", Status: 3, Reason: "no allow entry matches the host"})
	l.Record(egresslog.Record{Time: t, Agent: "a1", Kind: egresslog.KindHTTP, Host: "api.github.com", Port: 443, Method: "GET", Path: "/user?token=x", Status: 200, Allowed: true, Secret: "github"})
	l.Flush(context.Background()) // the JSON sink writes from its own goroutine

	for _, r := range l.List(egresslog.Filter{Agent: "a1", DeniedOnly: true}, 10) {
		fmt.Println("denied:", r.Host, "-", r.Reason)
	}
	fmt.Println("injected:", l.Stats()["a1"].Injected)
	l.Shutdown(context.Background())
	// Output:
	// {"seq":1,"time":"2026-11-29T08:00:00Z","agent":"a1","kind":"dns","host":"exfil.evil.example","method":"TXT","status":3,"allowed":false,"reason":"no allow entry matches the host"}
	// {"seq":2,"time":"2026-11-29T08:00:00Z","agent":"a1","kind":"http","host":"api.github.com","port":443,"method":"GET","path":"/user","status":200,"allowed":true,"secret":"github"}
	// denied: exfil.evil.example - no allow entry matches the host
	// injected: 1
}

// Following the log: a reader sees new records as they are made, and a
// connection still open is listed as such until it ends.
func ExampleLog_Follow() {
	l := &egresslog.Log{}
	defer l.Shutdown(context.Background())
	f := l.Follow(context.Background(), egresslog.Filter{Agent: "a1"}, 16)
	defer f.Close()

	conn := l.Begin(egresslog.Record{Agent: "a1", Kind: egresslog.KindTLS, Host: "api.github.com", Port: 443, Allowed: true})
	fmt.Println("open:", len(l.OpenConns("a1")))
	conn.End(egresslog.Record{Agent: "a1", Kind: egresslog.KindTLS, Host: "api.github.com", Port: 443, Allowed: true, BytesUp: 517, BytesDown: 4096, Reason: "closed"})
	r := <-f.C
	fmt.Println("followed:", r.Host, r.BytesUp, r.BytesDown, r.Reason, "| open:", len(l.OpenConns("a1")))
	// Output:
	// open: 1
	// followed: api.github.com 517 4096 closed | open: 0
}

// A file of records that cannot fill the disk: rotated when a line would
// take it past MaxBytes, with Keep rotated files kept.
func ExampleJSONFile() {
	dir, err := os.MkdirTemp("", "egresslog")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "egress.jsonl")
	sink, err := egresslog.JSONFile{Path: path, MaxBytes: 4 << 10, Keep: 2}.Open()
	if err != nil {
		fmt.Println(err)
		return
	}
	l := &egresslog.Log{Sinks: []egresslog.Sink{sink}}
	t := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	for range 200 {
		l.Record(egresslog.Record{Time: t, Agent: "a1", Kind: egresslog.KindTLS, Host: "api.github.com", Port: 443, Allowed: true})
	}
	l.Shutdown(context.Background()) // writes out and closes the file

	names, _ := filepath.Glob(path + "*")
	for _, name := range names {
		fi, _ := os.Stat(name)
		fmt.Println(filepath.Base(name), fi.Size() <= 4<<10)
	}
	// Output:
	// egress.jsonl true
	// egress.jsonl.1 true
	// egress.jsonl.2 true
}
