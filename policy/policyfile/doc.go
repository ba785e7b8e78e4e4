// Package policyfile reads a policy document (policy.Document, in YAML or
// JSON, its keys in camelCase) and keeps the policy of a watched file
// current, fail closed at every step: whatever goes wrong (an absent,
// empty, unreadable, oversized or invalid file, an unknown key, a broken
// edit after a good one) yields a policy that denies everything, with the
// reason, and an error with the detail. An unknown key that differs from
// a known one only in spelling (allow-private-networks) is named with the
// key meant (allowPrivateNetworks).
//
// It is apart from package policy so that matching needs neither YAML
// nor a file watcher: only a program that reads policy files links them.
//
// Typical use (ExampleWatch runs it):
//
//	w, err := policyfile.Watch("/etc/egress/policy.yaml", policyfile.WatchConfig{Logger: log})
//	...
//	d := w.Policy().Decide("api.github.com", 443)
package policyfile
