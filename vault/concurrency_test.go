package vault

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatedStorage is a MemoryStorage whose Save waits while the gate is shut,
// standing in for a slow disk (an fsync under load).
type gatedStorage struct {
	MemoryStorage
	gate chan struct{} // receives to let one Save through; nil lets all
}

func (g *gatedStorage) Save(data []byte) error {
	if g.gate != nil {
		<-g.gate
	}
	return g.MemoryStorage.Save(data)
}

// TestSlowWriteDoesNotStallInjection stores a secret while the disk is
// stuck: every agent's injection, and every read, goes on meanwhile.
func TestSlowWriteDoesNotStallInjection(t *testing.T) {
	st := &gatedStorage{}
	v, err := Open(st, testKey(1), Config{})
	require.NoError(t, err)
	rule := Rule{Hosts: []string{"api.example.com"}, Header: "Authorization", Template: "Bearer {{.Value}}"}
	require.NoError(t, v.Set(Secret{Name: "api", Rule: rule}, []byte("v1")))
	_, err = v.Attach("a1", "api", "API_KEY")
	require.NoError(t, err)

	st.gate = make(chan struct{})
	written := make(chan error, 1)
	go func() { written <- v.Set(Secret{Name: "other", Rule: rule}, []byte("v2")) }()

	done := make(chan struct{})
	go func() {
		defer close(done)
		r, _ := http.NewRequest("GET", "https://api.example.com/", nil)
		used, err := v.Inject("a1", r)
		assert.NoError(t, err)
		assert.Equal(t, []string{"api"}, used)
		assert.Equal(t, "Bearer v1", r.Header.Get("Authorization"))
		assert.True(t, v.Covers("a1", "api.example.com"))
		assert.Len(t, v.List(), 1, "the write in progress is not visible before it is stored")
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		require.FailNow(t, "injection waited for a write stuck on the disk")
	}
	st.gate <- struct{}{}
	require.NoError(t, <-written)
	assert.Len(t, v.List(), 2, "the write is visible once stored")
}

// TestReplaceKeepsAConcurrentRule rotates a value while its rule changes:
// neither change may be lost, whatever the interleaving.
func TestReplaceKeepsAConcurrentRule(t *testing.T) {
	v, err := Open(&MemoryStorage{}, testKey(1), Config{})
	require.NoError(t, err)
	require.NoError(t, v.Set(Secret{Name: "tok", Rule: Rule{Hosts: []string{"h0.example.com"}, Header: "Authorization"}}, []byte("value-0")))
	_, err = v.Attach("a1", "tok", "TOK")
	require.NoError(t, err)
	for i := 1; i <= 200; i++ {
		host := fmt.Sprintf("h%d.example.com", i)
		value := fmt.Sprintf("value-%d", i)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			assert.NoError(t, v.SetRule("tok", Rule{Hosts: []string{host}, Header: "Authorization"}))
		}()
		go func() { defer wg.Done(); assert.NoError(t, v.Replace("tok", []byte(value))) }()
		wg.Wait()
		require.Equal(t, []string{host}, v.List()[0].Rule.Hosts, "round %d: the rule change was lost", i)
		r, _ := http.NewRequest("GET", "https://"+host+"/", nil)
		_, err := v.Inject("a1", r)
		require.NoError(t, err)
		require.Equal(t, value, r.Header.Get("Authorization"), "round %d: the new value was lost", i)
	}
}

// TestNotFoundErrors lets callers branch on a missing secret or
// attachment without reading the message.
func TestNotFoundErrors(t *testing.T) {
	v, err := Open(&MemoryStorage{}, testKey(1), Config{})
	require.NoError(t, err)
	for name, err := range map[string]error{
		"Delete":  v.Delete("none"),
		"SetRule": v.SetRule("none", Rule{Hosts: []string{"x.example.com"}, Header: "X"}),
		"Replace": v.Replace("none", []byte("v")),
		"Detach":  v.Detach("a1", "none"),
		"Attach":  func() error { _, err := v.Attach("a1", "none", "X"); return err }(),
	} {
		assert.ErrorIs(t, err, ErrNotFound, name)
		assert.Contains(t, err.Error(), `"none"`, name)
	}
	assert.NotErrorIs(t, v.Set(Secret{Name: "bad name"}, []byte("v")), ErrNotFound)
}
