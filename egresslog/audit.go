package egresslog

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// An audited file (JSONFile.Seal) chains its lines and seals them: every
// line carries its place in the chain ("chain", counting from 1 across
// files) and the SHA-256 of the line before it ("prev", hex); a seal line
// ({"seal": N, "hash": H, "sig": S}) signs with Ed25519 the hash of line
// N, and with it every line before. A seal ends each file, and is written
// at most once a second (DefaultSealEvery) whenever the file is written
// out, so that a crash leaves few lines unsealed. A file begins with a
// segment line chained to the last line of the one before, and Verify
// takes a file whose first chained line is not one as cut at its start.
// A file is sealed by one key: opened with another (a key replaced), the
// file is rotated first, and each key's files verify with it. A gateway
// that takes up a chain whose last lines no seal of its key covers
// (written before a crash, or by someone without the key: it cannot tell)
// says so in a resume line ({"resume": true, "unvouched": K}) before its
// own, and its seals never vouch for those K lines (Verify lists them).
// A person without the key can change, remove, reorder or add lines
// without Verify saying where only at the end, where no seal covers
// them; lines cut from the end, seals and all, leave an honest-looking
// trail that only a witness outside the files (the count of lines
// written, kept elsewhere) tells apart.

// DefaultSealEvery is how often, at most, an audited file is sealed as it
// is written out.
const DefaultSealEvery = time.Second

// sealDomain is what a seal's signature covers besides the line's place
// and hash, so that no other signature of the key passes for one.
const sealDomain = "agenthold egress audit seal\x00"

// chain is the state of an audited file's chain.
type chain struct {
	key      ed25519.PrivateKey
	seq      uint64
	prev     [32]byte
	unsealed bool // lines since the last seal
	sealed   time.Time
	inFile   bool // the current file holds a chained line: it began with a segment line
	otherKey bool // the current file's last seal is another key's
	// unvouched is how many chained lines the resumed file holds after
	// its last seal of this key, to be told in a resume line.
	unvouched int
}

// link chains a line (JSON object, no newline): it appends the line's
// place and the hash of the one before, and returns the line with a
// newline.
func (c *chain) link(line []byte) []byte {
	c.seq++
	line = append(line[:len(line)-1], `,"chain":`...)
	line = strconv.AppendUint(line, c.seq, 10)
	line = append(line, `,"prev":"`...)
	line = hex.AppendEncode(line, c.prev[:])
	line = append(line, `"}`...)
	c.prev = sha256.Sum256(line)
	c.unsealed = true
	return append(line, '\n')
}

// segment is the first line of a file: chained to the last line of the
// one before.
func (c *chain) segment() []byte {
	return c.link([]byte(`{"segment":true}`))
}

// resumeLine is the first line a resumed chain writes when lines no
// seal of its key covers came before it; "" when none did.
func (c *chain) resumeLine() []byte {
	if c.unvouched == 0 {
		return nil
	}
	line := c.link(fmt.Appendf(nil, `{"resume":true,"unvouched":%d}`, c.unvouched))
	c.unvouched = 0
	return line
}

// seal is the line that signs the chain up to now.
func (c *chain) seal(now time.Time) []byte {
	c.unsealed, c.sealed = false, now
	sig := ed25519.Sign(c.key, sealMessage(c.seq, c.prev))
	return fmt.Appendf(nil, `{"seal":%d,"hash":"%x","sig":"%s"}`+"\n", c.seq, c.prev, base64.StdEncoding.EncodeToString(sig))
}

func sealMessage(seq uint64, hash [32]byte) []byte {
	msg := append([]byte(sealDomain), binary.BigEndian.AppendUint64(nil, seq)...)
	return append(msg, hash[:]...)
}

// resume takes up the chain of an existing file from its last whole
// chained line, so that a restarted gateway continues it; or, when the
// file holds none (a crash came between a rotation and the new file's
// first write), from the last of the file rotated before it.
func (c *chain) resume(path string) error {
	found, err := c.resumeFrom(path)
	if err != nil || found {
		c.inFile = found
		return err
	}
	_, err = c.resumeFrom(path + ".1")
	return err
}

// resumeFrom takes up the chain from the last whole chained line of the
// file at path, if it has one.
func (c *chain) resumeFrom(path string) (found bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	pub := c.key.Public().(ed25519.PublicKey)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	c.unvouched = 0
	for sc.Scan() {
		var l auditLine
		switch {
		case json.Unmarshal(sc.Bytes(), &l) != nil:
		case l.Chain != nil:
			c.seq, c.prev, found = *l.Chain, sha256.Sum256(sc.Bytes()), true
			c.unvouched++
		case l.Seal != nil:
			sig, err := base64.StdEncoding.DecodeString(l.Sig)
			c.otherKey = err != nil || !ed25519.Verify(pub, sealMessage(*l.Seal, c.prev), sig)
			if !c.otherKey && *l.Seal == c.seq {
				c.unvouched = 0
			}
		}
	}
	if c.otherKey {
		c.unvouched = 0 // the file is rotated, and the chain begins anew under this key
	}
	return found, sc.Err()
}

// auditLine is what Verify reads of a line.
type auditLine struct {
	Segment   bool    `json:"segment"`
	Resume    bool    `json:"resume"`
	Unvouched int     `json:"unvouched"`
	Chain     *uint64 `json:"chain"`
	Prev      string  `json:"prev"`
	Seal      *uint64 `json:"seal"`
	Hash      string  `json:"hash"`
	Sig       string  `json:"sig"`
}

// Verification is what Verify found.
type Verification struct {
	Lines  int // chained lines read
	Sealed int // of them, covered by a valid seal
	// Unsealed are the last lines, which no seal covers yet: written
	// after the last seal by a gateway that stopped (or still writes),
	// or added by someone without the key. Never counted as Problems.
	Unsealed []Place
	// Unvouched are lines a restarted gateway found after its last seal
	// and could not vouch for (its resume line says how many): written
	// before a crash, or added by someone without the key. No seal
	// covers them; never counted as Problems.
	Unvouched []Place
	Problems  []Problem
}

// Place is a line of a file (counting from 1).
type Place struct {
	File string
	Line int
}

// Problem is a place where the files were changed.
type Problem struct {
	Place
	What string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.What) }

// Verify checks audited files, given oldest first (path.2, path.1,
// path), with the public half of the key that sealed them: that each
// line follows the one before, that the chain counts on without a gap,
// and that each seal signs the chain up to its line. It reports each
// place where a line was changed, removed, reordered or added, and the
// lines at the end that no seal covers.
func Verify(pub ed25519.PublicKey, paths ...string) (Verification, error) {
	var v Verification
	var prev [32]byte
	var seq uint64
	started := false
	var pending []Place // chained lines since the last valid seal
	for i, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return v, err
		}
		err = v.verifyFile(f, path, i == len(paths)-1, pub, &prev, &seq, &started, &pending)
		f.Close()
		if err != nil {
			return v, err
		}
	}
	v.Unsealed = pending
	return v, nil
}

// verifyFile checks one file; last says it is the newest, the only one
// a crash can have left a line of cut short in (a rotated file ends with
// its whole seal line, and a restart cuts a torn line off).
func (v *Verification) verifyFile(r io.Reader, path string, last bool, pub ed25519.PublicKey, prev *[32]byte, seq *uint64, started *bool, pending *[]Place) error {
	br := bufio.NewReader(r)
	first := true // no chained line of this file read yet
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if len(line) == 0 && err == io.EOF {
			return nil
		}
		if err != nil && err != io.EOF {
			return err
		}
		at := Place{path, n}
		if !bytes.HasSuffix(line, []byte("\n")) {
			if !last {
				v.Problems = append(v.Problems, Problem{at, "a line without its end in a finished file (added)"})
				return nil
			}
			// A line cut short: a crash mid-write, if nothing follows.
			*pending = append(*pending, at)
			return nil
		}
		line = line[:len(line)-1]
		var l auditLine
		if json.Unmarshal(line, &l) != nil {
			v.Problems = append(v.Problems, Problem{at, "not a JSON line"})
			continue
		}
		switch {
		case l.Seal != nil:
			v.checkSeal(at, l, pub, *prev, *seq, pending)
		case l.Chain == nil:
			v.Problems = append(v.Problems, Problem{at, "a line without its place in the chain (added)"})
		default:
			v.Lines++
			if first && !l.Segment {
				v.Problems = append(v.Problems, Problem{at, "the file does not begin with its segment line (lines removed before this one)"})
			}
			first = false
			if *started {
				switch {
				case *l.Chain <= *seq:
					v.Problems = append(v.Problems, Problem{at, fmt.Sprintf("line %d of the chain comes after line %d (lines reordered or repeated)", *l.Chain, *seq)})
				case *l.Chain > *seq+1:
					v.Problems = append(v.Problems, Problem{at, fmt.Sprintf("the chain jumps from line %d to %d (lines removed)", *seq, *l.Chain)})
				case l.Prev != hex.EncodeToString(prev[:]):
					v.Problems = append(v.Problems, Problem{at, "does not follow the line before it (that line was changed)"})
				}
			}
			*started, *seq, *prev = true, *l.Chain, sha256.Sum256(line)
			if l.Resume {
				if l.Unvouched != len(*pending) {
					v.Problems = append(v.Problems, Problem{at, fmt.Sprintf("the resume line found %d lines after the last seal, here are %d (lines added or removed)", l.Unvouched, len(*pending))})
				}
				v.Unvouched = append(v.Unvouched, *pending...)
				*pending = (*pending)[:0]
			}
			*pending = append(*pending, at)
		}
	}
}

// checkSeal checks a seal against the chain so far.
func (v *Verification) checkSeal(at Place, l auditLine, pub ed25519.PublicKey, prev [32]byte, seq uint64, pending *[]Place) {
	sig, err := base64.StdEncoding.DecodeString(l.Sig)
	switch {
	case err != nil || !ed25519.Verify(pub, sealMessage(*l.Seal, prev), sig):
		v.Problems = append(v.Problems, Problem{at, "a seal that does not sign the lines before it (they were changed, or the seal forged)"})
	case *l.Seal != seq || l.Hash != hex.EncodeToString(prev[:]):
		v.Problems = append(v.Problems, Problem{at, "a seal of another place in the chain"})
	default:
		v.Sealed += len(*pending)
		*pending = (*pending)[:0]
	}
}
