// Package snapshot writes a store's entries to a file and reads them back,
// so that a restarted process answers from the cache it had.
//
// The file is untrusted input when read: a process may have died while
// writing it (the writer renames a complete file into place, but a disk
// may still lose its tail), another version may have written it, anyone
// with the file system may have. So every length is bounded, every frame
// checksummed, every entry checked as internal/entry.Check checks it, and
// the whole file is read and checked before the first entry goes into the
// store: a damaged file loads nothing.
//
// Layout, integers little endian:
//
//	header  magic "CCSNAP" (6), version (2), written: unix seconds (8),
//	        fingerprint (32), CRC-32C of the preceding 48 bytes (4)
//	frames  length (4), CRC-32C of the frame (4), the frame: entries, each
//	        as the store holds it (its size first), one after the other
//	end     a frame of length 0 and CRC 0
package snapshot

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/store"
)

const (
	magic   = "CCSNAP"
	version = 1

	headerLen = 6 + 2 + 8 + 32 + 4
	// maxFrame bounds a frame, and holds the largest entry.
	maxFrame = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Fingerprint names the settings that decide what the entries of a store
// hold; a file written under others is not read.
type Fingerprint [32]byte

// Errors of a file that is not read; each is wrapped with what was found.
var (
	ErrNotSnapshot = errors.New("not a compactcache snapshot")
	ErrVersion     = errors.New("a snapshot of another format version")
	ErrSettings    = errors.New("a snapshot of other cache settings or another entry format")
	ErrDamaged     = errors.New("a damaged snapshot")
)

// Write writes the entries walk visits to w, with the fingerprint of the
// store's settings and the wall clock's now, unix seconds. No shard is
// locked longer than it takes to copy one chunk. It returns the number of
// entries written.
func Write(w io.Writer, walk store.Walker, fp Fingerprint, now int64) (int, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	var h [headerLen]byte
	copy(h[:], magic)
	binary.LittleEndian.PutUint16(h[6:], version)
	binary.LittleEndian.PutUint64(h[8:], uint64(now))
	copy(h[16:48], fp[:])
	binary.LittleEndian.PutUint32(h[48:], crc32.Checksum(h[:48], castagnoli))
	if _, err := bw.Write(h[:]); err != nil {
		return 0, err
	}
	// The entries of a chunk are copied under its shard's lock, then written
	// out from the copy with the lock released, in frames of at most
	// maxFrame bytes.
	out := frames{cur: make([]byte, 0, maxFrame), spare: make([]byte, 0, maxFrame)}
	n := 0
	err := walk(func(e entry.Entry) bool {
		out.cur = append(out.cur, e...)
		n++
		return false
	}, func() error { return out.cut(bw) })
	if err != nil {
		return n, err
	}
	if len(out.head)+len(out.cur) > 0 {
		if err := writeFrame(bw, out.head, out.cur); err != nil {
			return n, err
		}
	}
	if err := writeFrame(bw); err != nil {
		return n, err
	}
	return n, bw.Flush()
}

// frames cuts the copies of chunks into frames, each of as many entries as
// maxFrame holds, and writes each from the copies. The chunks of a frame
// follow one another in cur, but for its first entries (head): the rest of
// the chunk in which the frame before it ended, left in the other buffer,
// spare, while cur starts again empty.
type frames struct {
	cur     []byte // the chunks copied since the last frame ended in one
	scanned int    // the bytes of cur cut already
	head    []byte // in spare
	spare   []byte
}

// cut writes the frames that the chunk copied last to cur completes.
func (b *frames) cut(w io.Writer) error {
	start, size := 0, len(b.head)+b.scanned // the frame: head, then cur[start:off]
	for off := b.scanned; off < len(b.cur); {
		n := entry.SizeAt(b.cur[off:])
		if size+n > maxFrame {
			if err := writeFrame(w, b.head, b.cur[start:off]); err != nil {
				return err
			}
			b.head, start, size = nil, off, 0
		}
		size += n
		off += n
	}
	b.scanned = len(b.cur)
	if start > 0 {
		b.head = b.cur[start:]
		b.cur, b.spare, b.scanned = b.spare[:0], b.cur, 0
	}
	return nil
}

// writeFrame writes a frame of the bytes of pieces, one after the other.
func writeFrame(w io.Writer, pieces ...[]byte) error {
	var h [8]byte
	size, sum := 0, uint32(0)
	for _, p := range pieces {
		size += len(p)
		sum = crc32.Update(sum, castagnoli, p)
	}
	binary.LittleEndian.PutUint32(h[:], uint32(size))
	binary.LittleEndian.PutUint32(h[4:], sum)
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	for _, p := range pieces {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// Loaded is what Read took from a file.
type Loaded struct {
	Written int64 // when the file was written, unix seconds
	Entries int   // put into the store
	Expired int   // dropped: expired beyond the serve-stale window
}

// Read reads a file that Write wrote from r, at most limit bytes of it,
// checks all of it, then puts into s the entries that have not expired
// beyond grace seconds at now (unix seconds). Entries keep the time they
// were stored at, so they age by the wall-clock time since. A file that
// fails a check puts nothing, and the error says why.
func Read(r io.Reader, limit int64, s *store.Store, fp Fingerprint, now, grace int64) (Loaded, error) {
	var l Loaded
	br := bufio.NewReaderSize(io.LimitReader(r, limit), 1<<16)
	var h [headerLen]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return l, fmt.Errorf("%w: the header: %v", ErrNotSnapshot, err)
	}
	if string(h[:6]) != magic {
		return l, fmt.Errorf("%w: magic %q", ErrNotSnapshot, h[:6])
	}
	if v := binary.LittleEndian.Uint16(h[6:]); v != version {
		return l, fmt.Errorf("%w: version %d, this build reads %d", ErrVersion, v, version)
	}
	if crc32.Checksum(h[:48], castagnoli) != binary.LittleEndian.Uint32(h[48:]) {
		return l, fmt.Errorf("%w: the header's checksum", ErrDamaged)
	}
	if Fingerprint(h[16:48]) != fp {
		return l, ErrSettings
	}
	l.Written = int64(binary.LittleEndian.Uint64(h[8:]))
	var frames [][]byte
	count := 0 // entries in the frames
	for {
		var bh [8]byte
		if _, err := io.ReadFull(br, bh[:]); err != nil {
			return l, fmt.Errorf("%w: cut before its end: %v", ErrDamaged, err)
		}
		n, sum := binary.LittleEndian.Uint32(bh[:]), binary.LittleEndian.Uint32(bh[4:])
		if n == 0 {
			if sum != 0 {
				return l, fmt.Errorf("%w: the end frame", ErrDamaged)
			}
			break
		}
		if n > maxFrame {
			return l, fmt.Errorf("%w: a frame of %d bytes", ErrDamaged, n)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return l, fmt.Errorf("%w: cut in a frame: %v", ErrDamaged, err)
		}
		if crc32.Checksum(b, castagnoli) != sum {
			return l, fmt.Errorf("%w: a frame's checksum", ErrDamaged)
		}
		held, err := checkFrame(b)
		if err != nil {
			return l, fmt.Errorf("%w: %v", ErrDamaged, err)
		}
		frames = append(frames, b)
		count += held
	}
	if _, err := br.ReadByte(); err != io.EOF {
		return l, fmt.Errorf("%w: bytes past its end", ErrDamaged)
	}
	entries := make([]entry.Entry, 0, count)
	var size int64
	for _, b := range frames {
		for off := 0; off < len(b); {
			n := entry.SizeAt(b[off:])
			e := entry.Entry(b[off : off+n])
			off += n
			if e.Expires()+grace < now {
				l.Expired++
				continue
			}
			entries = append(entries, e)
			size += int64(n)
		}
	}
	// Where they may not all fit the budget, the most recently used go
	// last, so that the store's eviction keeps them. The index and the
	// arenas' slack cost a store less than a third of its entries' bytes.
	if 4*size > 3*s.Capacity() {
		sortByUse(entries)
	}
	for _, e := range entries {
		s.Put(e, now)
	}
	l.Entries = len(entries)
	return l, nil
}

// sortByUse orders entries from the least recently used to the most, those
// used in the same second in the order they came: a stable sort's order.
// Each entry's time is read once, in the order the entries lie in memory,
// not at every comparison, where a stable sort's merges reach entries far
// apart.
func sortByUse(entries []entry.Entry) {
	type use struct {
		at int64
		i  int
	}
	order := make([]use, len(entries))
	for i, e := range entries {
		order[i] = use{e.LastUsed(), i}
	}
	slices.SortFunc(order, func(a, b use) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.i, b.i)) })
	sorted := make([]entry.Entry, len(entries))
	for k, u := range order {
		sorted[k] = entries[u.i]
	}
	copy(entries, sorted)
}

// checkFrame checks the entries of a frame one by one and returns how many
// it holds.
func checkFrame(b []byte) (int, error) {
	count := 0
	for off := 0; off < len(b); count++ {
		if len(b)-off < 4 {
			return 0, errors.New("an entry cut short")
		}
		n := entry.SizeAt(b[off:])
		if n < 4 || n > len(b)-off {
			return 0, fmt.Errorf("an entry of %d bytes in %d", n, len(b)-off)
		}
		if err := entry.Check(b[off : off+n]); err != nil {
			return 0, fmt.Errorf("an entry: %v", err)
		}
		off += n
	}
	return count, nil
}
