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
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"

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

// Filter copies the file r holds, which Write wrote under fp, to w but for
// the entries drop picks, with the time it was written, and returns the
// entries it wrote: a flush that began while Write walked the store
// covers entries that Write copied before it began.
func Filter(w io.Writer, r io.Reader, fp Fingerprint, drop func(e entry.Entry) bool) (int, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	h, err := readHeader(br, fp)
	if err != nil {
		return 0, err
	}
	frame := make([]byte, maxFrame)
	var werr error // of w, not the file's damage
	walk := func(visit func(e entry.Entry) bool, between func() error) error {
		err := readFrames(br, frame, func(b []byte) error {
			err := eachEntry(b, func(e entry.Entry) error {
				if !drop(e) {
					visit(e)
				}
				return nil
			})
			if err == nil {
				werr = between()
				err = werr
			}
			return err
		})
		if werr != nil {
			return werr
		}
		return err
	}
	return Write(w, walk, fp, int64(binary.LittleEndian.Uint64(h[8:])))
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

// Store is where Read puts a file's entries: a block's store, or one that
// leaves out what a flush made since the file was taken covers.
type Store interface {
	Capacity() int64
	Limits() store.PerKind
	Put(e entry.Entry, now int64) store.Displaced
}

// Read reads a file that Write wrote from r, checks all of it, then puts
// into s the entries that have not expired beyond grace seconds at now
// (unix seconds). An entry of a TTL over maxTTL seconds, the longest the
// reader's block stores an answer for, fails the checks: the writer's
// block, of the same settings, capped it. Entries keep the time they were
// stored at, so they age by the wall-clock time since; a file written by a
// clock ahead of the reader's has its times moved back by the difference,
// so that no entry is served unaged for as long as the clocks differ. A
// file that fails a check puts nothing, and the error says why.
//
// Read holds a frame of the file at a time, never the file: a store's file
// is about as large as the store, and held whole while the store fills it
// would double the memory a process needs when it starts. So it reads r
// more than once. The first pass checks everything and tallies the
// entries' bytes by how long ago each was last used; a damaged file stops
// there, before anything is stored. Then the most recently used entries
// that the budget can hold, and no older ones, are put in up to maxBands
// passes from r's start, each a band of last uses, the least recently used
// band first: where the budget, or an entry cap (which a store does not
// tell), keeps fewer of them, the store's eviction drops the least
// recently used.
func Read(r io.ReadSeeker, s Store, fp Fingerprint, now, grace, maxTTL int64) (Loaded, error) {
	var l Loaded
	br := bufio.NewReaderSize(r, 1<<16)
	h, err := readHeader(br, fp)
	if err != nil {
		return l, err
	}
	l.Written = int64(binary.LittleEndian.Uint64(h[8:]))
	c := clock{now: now, grace: grace, shift: max(0, l.Written-now)}
	frame := make([]byte, maxFrame)
	var uses tally
	err = readFrames(br, frame, func(b []byte) error {
		return eachEntry(b, func(e entry.Entry) error {
			if err := check(e, maxTTL); err != nil {
				return fmt.Errorf("an entry: %v", err)
			}
			if c.expired(e) {
				l.Expired++
			} else {
				uses.add(c.age(e), len(e), store.KindOf(e))
			}
			return nil
		})
	})
	if err != nil {
		return l, err
	}
	bands := uses.bands(s.Capacity())
	if uses.fits(s.Capacity(), s.Limits()) {
		// None is left out: the order they go in does not matter, and
		// one pass puts them all.
		bands = []band{{0, numBuckets - 1}}
	}
	for _, band := range bands {
		if _, err := r.Seek(0, io.SeekStart); err != nil {
			return l, err
		}
		br.Reset(r)
		if again, err := readHeader(br, fp); err != nil || again != h {
			return l, fmt.Errorf("%w: its header changed while it was read", ErrDamaged)
		}
		err := readFrames(br, frame, func(b []byte) error {
			return eachEntry(b, func(e entry.Entry) error {
				if c.expired(e) || !band.holds(c.age(e)) {
					return nil
				}
				// The frame's checksum matched again, but the file
				// may have been rewritten in place since the first
				// pass: an entry the store takes is checked as it
				// goes in.
				if err := check(e, maxTTL); err != nil {
					return fmt.Errorf("an entry: %v", err)
				}
				c.restamp(e)
				s.Put(e, now)
				l.Entries++
				return nil
			})
		})
		if err != nil {
			return l, fmt.Errorf("changed while it was read: %w", err)
		}
	}
	return l, nil
}

// check checks e as entry.Check does, and that its TTL is at most maxTTL
// seconds; a variant list's, which outlives the variants it lists, is not
// an answer's.
func check(e entry.Entry, maxTTL int64) error {
	if err := entry.Check(e); err != nil {
		return err
	}
	if e.Flags()&entry.FlagMeta == 0 && int64(e.TTL()) > maxTTL {
		return fmt.Errorf("a TTL of %d s, over the %d s an answer is stored for", e.TTL(), maxTTL)
	}
	return nil
}

// readHeader reads a file's header from r and checks it.
func readHeader(r io.Reader, fp Fingerprint) ([headerLen]byte, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return h, fmt.Errorf("%w: the header: %v", ErrNotSnapshot, err)
	}
	if string(h[:6]) != magic {
		return h, fmt.Errorf("%w: magic %q", ErrNotSnapshot, h[:6])
	}
	if v := binary.LittleEndian.Uint16(h[6:]); v != version {
		return h, fmt.Errorf("%w: version %d, this build reads %d", ErrVersion, v, version)
	}
	if crc32.Checksum(h[:48], castagnoli) != binary.LittleEndian.Uint32(h[48:]) {
		return h, fmt.Errorf("%w: the header's checksum", ErrDamaged)
	}
	if Fingerprint(h[16:48]) != fp {
		return h, ErrSettings
	}
	return h, nil
}

// readFrames reads the frames that follow the header from r, through the
// end frame and the end of r, each into buf (of maxFrame bytes) and, its
// checksum checked, to f. An error of f stops it, as damage.
func readFrames(r *bufio.Reader, buf []byte, f func(b []byte) error) error {
	for {
		var bh [8]byte
		if _, err := io.ReadFull(r, bh[:]); err != nil {
			return fmt.Errorf("%w: cut before its end: %v", ErrDamaged, err)
		}
		n, sum := binary.LittleEndian.Uint32(bh[:]), binary.LittleEndian.Uint32(bh[4:])
		if n == 0 {
			if sum != 0 {
				return fmt.Errorf("%w: the end frame", ErrDamaged)
			}
			break
		}
		if n > maxFrame {
			return fmt.Errorf("%w: a frame of %d bytes", ErrDamaged, n)
		}
		b := buf[:n]
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("%w: cut in a frame: %v", ErrDamaged, err)
		}
		if crc32.Checksum(b, castagnoli) != sum {
			return fmt.Errorf("%w: a frame's checksum", ErrDamaged)
		}
		if err := f(b); err != nil {
			return fmt.Errorf("%w: %v", ErrDamaged, err)
		}
	}
	if _, err := r.ReadByte(); err != io.EOF {
		return fmt.Errorf("%w: bytes past its end", ErrDamaged)
	}
	return nil
}

// clock reads a file's times as the reader's clock: a file's clock ahead
// of the reader's by shift seconds has its times moved back by as much,
// and a time still ahead of now (an entry stored before the writer's clock
// was set back) is taken as now.
type clock struct {
	now, grace, shift int64
}

// stored returns when e was stored, by the reader's clock.
func (c clock) stored(e entry.Entry) int64 {
	return max(0, min(int64(e.Stored())-c.shift, c.now))
}

// expired reports whether e expired beyond the serve-stale window.
func (c clock) expired(e entry.Entry) bool {
	return c.stored(e)+int64(e.TTL())+c.grace < c.now
}

// age returns the seconds since e was last used (entry.Idle: more than
// 2^16 read short).
func (c clock) age(e entry.Entry) int64 {
	return e.Idle(c.now - c.stored(e) + int64(e.Stored()))
}

// restamp writes into e the time it was stored by the reader's clock.
func (c clock) restamp(e entry.Entry) {
	if t := c.stored(e); t != int64(e.Stored()) {
		e.SetStored(uint32(t))
	}
}

// The tally counts bytes by age, in seconds since the last use: one bucket
// a second up to exactAges, about 18 hours, then one for each power of two.
// The entries of a bucket are put or left out together, which hardly
// matters where a second holds a small part of the budget; the older
// entries, which share longer buckets, are seldom those it chooses among.
const (
	exactAges  = 1 << 16
	numBuckets = exactAges + 64 - 16
)

// maxBands is the most passes over a file that put its entries: more,
// narrower bands keep the most recently used the more exactly where not
// all fit, each at the cost of a read of the file.
const maxBands = 8

// tally is the bytes of a file's entries by their age.
type tally struct {
	bytes []int64       // by bucket, the most recently used first
	total int64         // of all buckets
	kinds store.PerKind // entries of each kind
}

// bucket returns the tally's bucket of an age.
func bucket(age int64) int {
	if age < exactAges {
		return int(age)
	}
	return exactAges + bits.Len64(uint64(age)) - bits.Len64(exactAges)
}

// add counts an entry of kind and size bytes, last used age seconds ago.
func (t *tally) add(age int64, size, kind int) {
	if t.bytes == nil {
		t.bytes = make([]int64, numBuckets)
	}
	t.bytes[bucket(age)] += int64(size)
	t.total += int64(size)
	t.kinds[kind]++
}

// fits reports whether a store of budget bytes and entry caps limits (0:
// none) holds every entry tallied, with room to spare: the index and the
// arenas' slack cost a store less than a third of its entries' bytes, and
// shards apply their share of a cap each.
func (t *tally) fits(budget int64, limits store.PerKind) bool {
	if 4*t.total > 3*budget {
		return false
	}
	for k, n := range t.kinds {
		if limits[k] > 0 && 4*n > 3*limits[k] {
			return false
		}
	}
	return true
}

// band is the entries whose age falls in buckets [first, last].
type band struct{ first, last int }

// holds reports whether an entry last used age seconds ago is in the band.
func (b band) holds(age int64) bool {
	k := bucket(age)
	return b.first <= k && k <= b.last
}

// bands returns the bands of the most recently used entries whose bytes
// the budget can hold (or the most recently used bucket where it holds no
// whole one), in order of use: the least recently used band first, each
// of about as many bytes, up to maxBands.
func (t *tally) bands(budget int64) []band {
	if t.bytes == nil {
		return nil
	}
	var total int64
	cut := -1 // the oldest bucket taken
	for k, n := range t.bytes {
		if n == 0 {
			continue
		}
		if total+n > budget && cut >= 0 {
			break
		}
		total += n
		cut = k
	}
	var out []band
	var sum int64
	last := cut
	for k := cut; k >= 0; k-- {
		sum += t.bytes[k]
		// Each band closes once it holds its share of what is left.
		if sum > 0 && (k == 0 || sum*int64(maxBands-len(out)) >= total) {
			out = append(out, band{k, last})
			total -= sum
			sum, last = 0, k-1
		}
	}
	return out
}

// eachEntry runs f on the entries of a frame, one after the other. It
// checks only that each lies within the frame and holds a header, which
// the reader reads before it checks the entry whole.
func eachEntry(b []byte, f func(e entry.Entry) error) error {
	for off := 0; off < len(b); {
		if len(b)-off < 4 {
			return errors.New("an entry cut short")
		}
		n := entry.SizeAt(b[off:])
		if n < entry.MinLen || n > len(b)-off {
			return fmt.Errorf("an entry of %d bytes in %d", n, len(b)-off)
		}
		if err := f(entry.Entry(b[off : off+n])); err != nil {
			return err
		}
		off += n
	}
	return nil
}
