// Package learn turns an egress log's records into the observations
// policy.Suggest learns an allowlist from, and writes what a suggestion
// rests on: for a program that holds the log (agenthold asks its
// egresslog.Log) or reads it back from a file (the sidecar reads its
// JSON lines). It is the one place where the two blocks meet, so that
// neither imports the other.
package learn

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// Observation is what a record says an agent did: a DNS query, or a connection or
// request. It succeeded if it was allowed (report mode included) and
// carried out: a DNS answer, a connection that did not fail upstream.
func Observation(r egresslog.Record) (policy.Observation, bool) {
	if r.Host == "" || r.Agent == "" {
		return policy.Observation{}, false
	}
	o := policy.Observation{Host: r.Host, Port: r.Port, Time: r.Time, Succeeded: r.Allowed && !refusedOutright(r)}
	switch r.Kind {
	case egresslog.KindDNS:
		o.Port = 0
		o.Succeeded = o.Succeeded && r.Status == rcodeSuccess && r.Answers > 0
	case egresslog.KindTLS, egresslog.KindTCP, egresslog.KindHTTP, egresslog.KindConnect:
		if r.Port == 0 {
			return policy.Observation{}, false
		}
		o.Succeeded = o.Succeeded && !strings.HasPrefix(r.Reason, "upstream")
		if r.Kind == egresslog.KindHTTP {
			o.Method, o.Path = r.Method, r.Path
		}
	default:
		return policy.Observation{}, false
	}
	return o, true
}

// rcodeSuccess is DNS's NOERROR, the Status of a DNS record answered.
const rcodeSuccess = 0

// refusedOutright reports whether a record in report mode says what
// enforcement refuses whatever an allow entry says (a deny entry, a DNS
// side door): no suggestion may learn it.
func refusedOutright(r egresslog.Record) bool {
	if !r.Report {
		return false
	}
	switch r.Reason {
	case policy.ReasonDenyEntry, policy.ReasonDoH, policy.ReasonDoT:
		return true
	}
	return false
}

// Read reads JSON-line records (egresslog's file form) and returns the
// observations of agent's ("" for every agent's), and how many lines it
// could not read (a line cut short by a crash, say), which it skips.
func Read(r io.Reader, agent string) ([]policy.Observation, int, error) {
	var out []policy.Observation
	skipped := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		rec, err := egresslog.ParseJSON(sc.Bytes())
		if err != nil {
			if !auditLine(sc.Bytes()) {
				skipped++
			}
			continue
		}
		if agent != "" && rec.Agent != agent {
			continue
		}
		if o, ok := Observation(rec); ok {
			out = append(out, o)
		}
	}
	return out, skipped, sc.Err()
}

// auditLine reports whether a line is a file's own (a seal, the line that
// begins an audited file, the one a restarted gateway resumes its chain
// with, or one that says records were dropped there), which holds no
// record.
func auditLine(line []byte) bool {
	for _, prefix := range []string{`{"seal":`, `{"segment":true,`, `{"resume":true,`, `{"dropped":`} {
		if bytes.HasPrefix(line, []byte(prefix)) {
			return true
		}
	}
	return false
}

// WriteSupport writes, as YAML comments, what a suggestion rests on: how
// many records (from whom, if who is not ""), each entry's uses and first
// and last use, and what was only attempted and left out.
func WriteSupport(w io.Writer, s policy.Suggestion, who string, records, skipped int) {
	from := ""
	if who != "" {
		from = " of " + who
	}
	fmt.Fprintf(w, "# From %d records%s (%d unreadable, skipped). Each entry: uses, first and last seen.\n", records, from, skipped)
	for _, e := range s.Used {
		fmt.Fprintf(w, "#   %-40s %5d  %s  %s\n", e.Entry, e.Count, e.FirstSeen.Format(time.RFC3339), e.LastSeen.Format(time.RFC3339))
	}
	for _, e := range s.Attempted {
		fmt.Fprintf(w, "# only attempted, left out: %s (%d)\n", e.Entry, e.Count)
	}
}
