// Package persist keeps a block's cache across restarts: the snapshot file
// it writes when the process stops and every interval meanwhile, and reads
// when the process starts; and the warm-up from a peer's admin endpoint
// for a new replica without a file. The format is internal/snapshot's; the
// block is reached through Cache, the small interface the plugin
// implements. Nothing about a file or a peer stops the server from
// starting: a stream it cannot use is logged, counted and, for a damaged
// file, moved aside, and the block starts cold.
package persist

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/lifecycle"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/caddy"
	clog "github.com/coredns/coredns/plugin/pkg/log"
)

var log = clog.NewWithPlugin("compactcache")

// Cache is what snapshots and warm-ups reach of a block's cache.
type Cache interface {
	// Store returns the block's live store.
	Store() *store.Store
	// Fingerprint names the settings its entries were stored under.
	Fingerprint() snapshot.Fingerprint
	// Now returns the cache's clock, unix seconds.
	Now() int64
	// Grace is how long, in seconds, expired entries are kept for
	// serve_stale.
	Grace() int64
	// MaxTTL is the longest TTL, in seconds, it stores an answer with.
	MaxTTL() int64
	// Fence is the flushes begun on the store.
	Fence() *flush.Fence
}

// Snapshot is the `snapshot PATH [INTERVAL]` option: the block writes its
// store to PATH when the process shuts down for good (not on the shutdown
// every reload runs) and, with INTERVAL, that often meanwhile, so that a
// process killed at once (an OOM kill, SIGKILL, SIGQUIT) loses at most an
// interval; and reads it when the process starts, before its servers
// answer.
type Snapshot struct {
	path     string
	every    time.Duration // 0: only at shutdown
	restored int64         // when the file read at the process's start was written
}

// ParseSnapshot parses the option's arguments.
func ParseSnapshot(args []string) (*Snapshot, error) {
	if len(args) < 1 || len(args) > 2 {
		return nil, fmt.Errorf("snapshot: want PATH [INTERVAL], got %d arguments", len(args))
	}
	// Cleaned, as the key of the file among the blocks' and the writes'.
	sc := &Snapshot{path: filepath.Clean(args[0])}
	if !filepath.IsAbs(sc.path) {
		return nil, fmt.Errorf("snapshot: %q is not an absolute path", sc.path)
	}
	// A directory given for the file's path would be read as a damaged
	// file and moved aside, with what it holds.
	if fi, err := os.Stat(sc.path); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("snapshot: %q is not a regular file (%s): give the file's path", sc.path, fi.Mode().Type())
	}
	if len(args) == 2 {
		d, err := time.ParseDuration(args[1])
		if err != nil || d < time.Second {
			return nil, fmt.Errorf("snapshot: INTERVAL %q is not a duration of a second or more", args[1])
		}
		sc.every = d
	}
	return sc, nil
}

// pathsKey keeps, in a caddy instance's storage, the snapshot paths its
// blocks gave, with the keys of the block that gave each.
type pathsKey struct{}

// Setup reads the block's file once the process starts and writes it when
// the process stops, and every interval while it runs; a block without the
// option (sc nil) has nothing to set up. A path another block
// of the instance gave is refused: each block would read the other's
// entries, which split-horizon views must not serve to each other's
// clients, and the last to stop would write over the first.
func (sc *Snapshot) Setup(c *caddy.Controller, ca Cache) error {
	if sc == nil {
		return nil
	}
	paths, _ := c.Get(pathsKey{}).(map[string]string)
	if paths == nil {
		paths = map[string]string{}
		c.Set(pathsKey{}, paths)
	}
	block := strings.Join(c.ServerBlockKeys, " ")
	file := resolved(sc.path)
	if other, ok := paths[file]; ok {
		return fmt.Errorf("snapshot: %s is the file of block %s too: give each block a file of its own", sc.path, other)
	}
	paths[file] = block
	c.OnFirstStartup(func() error {
		removeTemporary(sc.path)
		sc.restored = Load(ca, sc.path)
		return nil
	})
	stop := make(chan struct{})
	if sc.every > 0 {
		c.OnStartup(func() error {
			timed.Add(c, &timedWrites{sc, ca, stop})
			return nil
		})
	}
	c.OnShutdown(func() error {
		close(stop)
		return nil
	})
	// Once no flush comes: one applied after the write would be undone
	// by the next start's read.
	lifecycle.OnLastStop(c, func() {
		// At full speed: the server is leaving, and the write must end
		// within the termination grace period.
		write(ca, sc.path, ca.Store().Paced(0))
	})
	return nil
}

// Restored returns when the file the block's store was read from at the
// process's start was written, unix seconds, or 0 where none was read (sc
// nil, a reload): the flushes sent since, through the shared tier, are
// missing from it.
func (sc *Snapshot) Restored() int64 {
	if sc == nil {
		return 0
	}
	return sc.restored
}

// resolved returns the file path names, with the symbolic links of its
// directory resolved, so that /var/run/x and /run/x are one file, and its
// own followed: where path is a link (to a file on a volume of its own),
// the file it points to, which may not exist yet. A write renames its file
// over that one, and a damaged one is moved aside there: renamed over the
// link, or moving it, they would leave the file it points to behind, read
// again once the link is put back (a container's file system made anew).
func resolved(path string) string {
	for range 40 { // the links Linux follows in a path
		l, err := os.Readlink(path)
		if err != nil {
			break
		}
		if !filepath.IsAbs(l) {
			l = filepath.Join(filepath.Dir(path), l)
		}
		path = l
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		return filepath.Join(dir, filepath.Base(path))
	}
	return path
}

// timedWrites are the writes every INTERVAL of one block.
type timedWrites struct {
	sc   *Snapshot
	ca   Cache
	stop chan struct{}
}

// timed starts the writes every INTERVAL of an instance once its servers
// are up: one that fails to start never shuts down, and its writes would
// go on, of its own store, over the file of the instance still serving.
var timed = lifecycle.New(func(_ *caddy.Instance, w *timedWrites) {
	go w.sc.writeEvery(w.ca, w.stop)
}, nil)

func (sc *Snapshot) writeEvery(ca Cache, stop <-chan struct{}) {
	t := time.NewTicker(sc.every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			write(ca, sc.path, pacedWalk(ca, stop))
		}
	}
}

// errStopping gives up a write under way when the instance shuts down: the
// final write, or the next instance's, takes its place, and one that the
// process's exit cut short would leave its temporary file behind.
var errStopping = errors.New("the instance is shutting down")

// snapshotRest is how many times as long as a chunk took a write every
// INTERVAL rests after it: an eighth of a core. A write that runs flat out
// takes a core from the queries, and a shard's lock with it whenever the
// machine preempts it while it copies a chunk. Writes come back every
// INTERVAL for as long as the server runs, where an admin walk is an
// operator's one-off, so they go at half the admin walks' pace.
var snapshotRest = time.Duration(7)

// pacedWalk walks the store resting snapshotRest times as long as each chunk
// took. It ends with errStopping once stop is closed.
func pacedWalk(ca Cache, stop <-chan struct{}) store.Walker {
	return func(visit func(e entry.Entry) bool, between func() error) error {
		return ca.Store().Paced(snapshotRest)(visit, func() error {
			select {
			case <-stop:
				return errStopping
			default:
				return between()
			}
		})
	}
}

// read fills the store from r, a snapshot's file or a peer's stream.
// snapshot.Read reads a file twice, a frame at a time. A stream, which
// cannot be read twice, is copied first to a file in os.TempDir() (TMPDIR)
// that is removed as soon as it is made, so that a process killed while
// it reads leaves nothing behind; where there is no room for one (a
// read-only root file system without a writable TMPDIR), it is held in
// memory instead, as much again as the store it fills takes. Either way it is bounded: the stream holds at most the
// peer's store, and four times the budget leaves room for a peer of a
// larger capacity (a rollout that lowers it), whose most recently used
// entries are kept. What a flush begun since gen covers is not put: a
// warm-up's stream was taken before a flush an operator made meanwhile.
func read(ca Cache, r io.Reader, gen uint64) (snapshot.Loaded, error) {
	s := ca.Store()
	rs, ok := r.(io.ReadSeeker)
	if !ok {
		spilled, err := spill(r, 4*s.Capacity()+1<<20)
		if err != nil {
			return snapshot.Loaded{}, err
		}
		defer spilled.Close()
		rs = spilled
	}
	f := &fenced{Store: s, fence: ca.Fence(), gen: gen}
	l, err := snapshot.Read(rs, f, ca.Fingerprint(), ca.Now(), ca.Grace(), ca.MaxTTL())
	l.Entries -= f.out
	return l, err
}

// fenced puts entries into a store unless a flush begun since gen covers
// them, as a fetch's answer is stored (flush.Fence), or the store holds
// one of the key stored as late: a warm-up fills a store that answers, and
// what it fetched meanwhile is newer than the peer's copy. It counts those
// it leaves out.
type fenced struct {
	*store.Store
	fence *flush.Fence
	gen   uint64
	out   int
}

func (f *fenced) Put(e entry.Entry, now int64) (d store.Displaced) {
	put := false
	f.fence.Store(f.gen, e, func() {
		d = f.Store.Update(e.Key(), now, func(old entry.Entry) entry.Entry {
			if old != nil && old.Stored() >= e.Stored() {
				return nil
			}
			put = true
			return e
		})
	})
	if !put {
		f.out++
	}
	return d
}

// spill copies r, at most limit bytes of it, to a file removed at once, or
// to memory where no such file can be made.
func spill(r io.Reader, limit int64) (io.ReadSeekCloser, error) {
	r = io.LimitReader(r, limit+1)
	f, err := os.CreateTemp("", "compactcache-stream-*")
	if err != nil {
		return hold(r, limit)
	}
	os.Remove(f.Name())
	n, err := io.Copy(f, r)
	if err == nil && n > limit {
		err = fmt.Errorf("a stream over %d bytes", limit)
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// pieces is a stream held in memory, in pieces of a frame's size: a buffer
// grown as it fills would at times hold the stream twice over while it
// copies it.
type pieces struct {
	b      [][]byte
	i, off int // where Read resumes
}

// hold reads r, at most limit bytes of it, into pieces.
func hold(r io.Reader, limit int64) (*pieces, error) {
	p := new(pieces)
	var n int64
	for {
		b := make([]byte, 1<<20)
		k, err := io.ReadFull(r, b)
		if k > 0 {
			p.b = append(p.b, b[:k])
			n += int64(k)
		}
		if n > limit {
			return nil, fmt.Errorf("a stream over %d bytes", limit)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return p, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *pieces) Read(b []byte) (int, error) {
	for p.i < len(p.b) && p.off == len(p.b[p.i]) {
		p.i, p.off = p.i+1, 0
	}
	if p.i == len(p.b) {
		return 0, io.EOF
	}
	n := copy(b, p.b[p.i][p.off:])
	p.off += n
	return n, nil
}

// Seek goes back to the start, the only place snapshot.Read seeks.
func (p *pieces) Seek(offset int64, whence int) (int64, error) {
	if offset != 0 || whence != io.SeekStart {
		return 0, errors.New("a stream held in memory seeks only to its start")
	}
	p.i, p.off = 0, 0
	return 0, nil
}

func (p *pieces) Close() error { return nil }

// Load fills the store from path, if there is a file there it can use, and
// returns when the file was written, or 0 where it put no entry of it.
func Load(ca Cache, path string) (written int64) {
	f, err := openFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		log.Infof("Snapshot %s: none yet, starting cold", path)
		return 0
	}
	if err != nil {
		cachemetrics.SnapshotErrors.WithLabelValues(path, "read").Inc()
		log.Errorf("Snapshot %s: starting cold: %v", path, err)
		return 0
	}
	defer f.Close()
	start := time.Now()
	l, err := read(ca, f, ca.Fence().Gen())
	switch {
	case errors.Is(err, snapshot.ErrSettings) || errors.Is(err, snapshot.ErrVersion):
		// A rollout or a rollback, not damage: the next write replaces it.
		log.Infof("Snapshot %s: written under other cache settings or by a build of another format, starting cold: %v", path, err)
	case err != nil:
		cachemetrics.SnapshotErrors.WithLabelValues(path, "read").Inc()
		file := resolved(path)
		aside := file + ".bad-" + strconv.FormatInt(time.Now().Unix(), 10)
		if rerr := os.Rename(file, aside); rerr == nil {
			log.Errorf("Snapshot %s: starting cold, the file moved to %s: %v", path, aside, err)
		} else {
			log.Errorf("Snapshot %s: starting cold: %v (and it could not be moved aside: %v)", path, err, rerr)
		}
	default:
		log.Infof("Snapshot %s: %d entries loaded in %v from a file written %v ago, %d expired",
			path, l.Entries, time.Since(start).Round(time.Millisecond), time.Duration(ca.Now()-l.Written)*time.Second, l.Expired)
	}
	if l.Entries > 0 { // a file changed while it was read may have put some
		return l.Written
	}
	return 0
}

// openFile opens path for reading if it is a regular file. Anything else
// is not a damaged file to move aside: a directory would go with what it
// holds, and a FIFO's reads wait for a writer. The file opened is checked,
// not the path before it, which may be swapped in between; and opened
// without blocking, which a FIFO's open would, waiting for a writer.
func openFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// removeTemporary removes the temporary files of writes to path that a
// process killed while writing (an OOM kill, SIGKILL, a grace period
// shorter than the final write) left beside it; nothing else would, and
// each is as large as the store. Run at the process's first startup,
// before this process writes any.
func removeTemporary(path string) {
	path = resolved(path)
	dir, prefix := filepath.Dir(path), filepath.Base(path)+".tmp-"
	files, _ := os.ReadDir(dir)
	for _, f := range files {
		if !strings.HasPrefix(f.Name(), prefix) || !f.Type().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(dir, f.Name())); err == nil {
			log.Infof("Snapshot %s: removed %s, left by a write that did not end", path, f.Name())
		}
	}
}

// writing holds a mutex for each path, which its writes take: the write at
// shutdown renames its file after that of a write every INTERVAL, of this
// instance or one before a reload, still under way when it began.
var writing sync.Map

// write writes the store to path atomically, walked by walk: to a file
// beside it, synced, then renamed over it.
func write(ca Cache, path string, walk store.Walker) {
	mu, _ := writing.LoadOrStore(path, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	start := time.Now()
	n, err := WriteFile(ca, path, walk)
	if errors.Is(err, errStopping) {
		log.Infof("Snapshot %s: the write under way given up: %v", path, err)
		return
	}
	if err != nil {
		cachemetrics.SnapshotErrors.WithLabelValues(path, "write").Inc()
		log.Errorf("Snapshot %s: not written: %v", path, err)
		return
	}
	log.Infof("Snapshot %s: %d entries written in %v", path, n, time.Since(start).Round(time.Millisecond))
}

// WriteFile writes the store to path as write does, and returns the
// entries written.
func WriteFile(ca Cache, path string, walk store.Walker) (int, error) {
	path = resolved(path)
	gen := ca.Fence().Gen()
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, err
	}
	defer func() { os.Remove(tmp.Name()) }() // a no-op once renamed
	n, err := snapshot.Write(tmp, walk, ca.Fingerprint(), ca.Now())
	// A flush that began during the walk removed what it covers from the
	// store, but not from the chunks the walk had copied before: loaded,
	// they would undo it. The file is copied without what the flushes
	// begun since the walk began cover, again while flushes begin during
	// a copy, up to maxCopies.
	for seen, copies := gen, 0; err == nil && copies < maxCopies; copies++ {
		now := ca.Fence().Gen()
		if now == seen {
			break
		}
		seen = now
		tmp, n, err = withoutFlushed(ca, path, tmp, gen)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return 0, err
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		dir.Sync() // the rename itself, on file systems that need it
		dir.Close()
	}
	return n, nil
}

// maxCopies bounds the copies of a write's file that leave out what the
// flushes begun during the write cover: a flush that begins during the
// last one is as one that begins once the write is done.
const maxCopies = 3

// withoutFlushed copies f, a write's temporary file for path, to another
// but for the entries the flushes begun since gen cover, and removes f. It
// returns the new file and the entries it holds.
func withoutFlushed(ca Cache, path string, f *os.File, gen uint64) (*os.File, int, error) {
	next, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return f, 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return next, 0, err
	}
	fence := ca.Fence()
	n, err := snapshot.Filter(next, f, ca.Fingerprint(), func(e entry.Entry) bool { return fence.Covers(gen, e) })
	return next, n, err
}
