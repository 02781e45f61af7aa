package compactcache

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/caddy"
)

// With `snapshot PATH [INTERVAL]` a block writes its store to PATH when the
// process shuts down for good (not on the shutdown every reload runs) and,
// with INTERVAL, that often meanwhile, so that a process killed at once (an
// OOM kill, SIGKILL, SIGQUIT) loses at most an interval; and reads it when
// the process starts, before its servers answer. A file it cannot use
// (written under other settings, damaged, of another format version,
// unreadable) is logged, counted and, when damaged, moved aside: the block
// starts cold. Nothing about the file stops the server from starting.

// snapshotConfig is the `snapshot` option.
type snapshotConfig struct {
	path  string
	every time.Duration // 0: only at shutdown
}

func parseSnapshot(args []string, ca *Cache) error {
	if len(args) < 1 || len(args) > 2 {
		return fmt.Errorf("snapshot: want PATH [INTERVAL], got %d arguments", len(args))
	}
	sc := &snapshotConfig{path: args[0]}
	if !filepath.IsAbs(sc.path) {
		return fmt.Errorf("snapshot: %q is not an absolute path", sc.path)
	}
	if len(args) == 2 {
		d, err := time.ParseDuration(args[1])
		if err != nil || d < time.Second {
			return fmt.Errorf("snapshot: INTERVAL %q is not a duration of a second or more", args[1])
		}
		sc.every = d
	}
	ca.snapshot = sc
	return nil
}

// fingerprint names the settings that decide what c's entries hold, and
// the entry format: a file written under others is not read.
func (c *Cache) fingerprint() snapshot.Fingerprint {
	return snapshot.Fingerprint(sha256.Sum256([]byte(fmt.Sprintf("compactcache entries %d %+v", snapshotFormat, c.contents()))))
}

// snapshotFormat changes with the entry format (internal/entry), so that a
// build does not read the entries of another.
const snapshotFormat = 2

// setupSnapshot reads the block's file once the process starts and writes
// it when the process stops, and every interval while it runs.
func setupSnapshot(c *caddy.Controller, ca *Cache) {
	sc := ca.snapshot
	if sc == nil {
		return
	}
	c.OnFirstStartup(func() error {
		ca.loadSnapshot(sc.path)
		return nil
	})
	stop := make(chan struct{})
	c.OnStartup(func() error {
		if sc.every > 0 {
			go ca.snapshotEvery(sc, stop)
		}
		return nil
	})
	c.OnShutdown(func() error {
		close(stop)
		return nil
	})
	c.OnFinalShutdown(func() error {
		// At full speed: the server is leaving, and the write must end
		// within the termination grace period.
		ca.writeSnapshot(sc.path, ca.store.Paced(0))
		return nil
	})
}

func (c *Cache) snapshotEvery(sc *snapshotConfig, stop <-chan struct{}) {
	t := time.NewTicker(sc.every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			c.writeSnapshot(sc.path, c.pacedWalk(stop))
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
func (c *Cache) pacedWalk(stop <-chan struct{}) store.Walker {
	return func(visit func(e entry.Entry) bool, between func() error) error {
		return c.store.Paced(snapshotRest)(visit, func() error {
			select {
			case <-stop:
				return errStopping
			default:
				return between()
			}
		})
	}
}

// readSnapshot fills the store from r, a snapshot's file or a peer's
// stream. The stream holds at most the store's entries, and each block
// bounds its own; twice the budget leaves room for the entries a full store
// lost.
func (c *Cache) readSnapshot(r io.Reader) (snapshot.Loaded, error) {
	return snapshot.Read(r, 2*c.store.Capacity()+1<<20, c.store, c.fingerprint(), c.now().Unix(), int64(c.staleUpTo/time.Second))
}

// loadSnapshot fills the store from path, if there is a file there it can
// use.
func (c *Cache) loadSnapshot(path string) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		log.Infof("Snapshot %s: none yet, starting cold", path)
		return
	}
	if err != nil {
		snapshotErrors.WithLabelValues(path, "read").Inc()
		log.Errorf("Snapshot %s: starting cold: %v", path, err)
		return
	}
	defer f.Close()
	start := time.Now()
	l, err := c.readSnapshot(f)
	switch {
	case errors.Is(err, snapshot.ErrSettings):
		log.Infof("Snapshot %s: written under other cache settings, starting cold", path)
	case err != nil:
		snapshotErrors.WithLabelValues(path, "read").Inc()
		aside := path + ".bad-" + strconv.FormatInt(time.Now().Unix(), 10)
		if rerr := os.Rename(path, aside); rerr == nil {
			log.Errorf("Snapshot %s: starting cold, the file moved to %s: %v", path, aside, err)
		} else {
			log.Errorf("Snapshot %s: starting cold: %v (and it could not be moved aside: %v)", path, err, rerr)
		}
	default:
		log.Infof("Snapshot %s: %d entries loaded in %v from a file written %v ago, %d expired",
			path, l.Entries, time.Since(start).Round(time.Millisecond), time.Duration(c.now().Unix()-l.Written)*time.Second, l.Expired)
	}
}

// writeSnapshot writes the store to path atomically, walked by walk: to a
// file beside it, synced, then renamed over it.
func (c *Cache) writeSnapshot(path string, walk store.Walker) {
	start := time.Now()
	n, err := c.writeSnapshotFile(path, walk)
	if errors.Is(err, errStopping) {
		log.Infof("Snapshot %s: the write under way given up: %v", path, err)
		return
	}
	if err != nil {
		snapshotErrors.WithLabelValues(path, "write").Inc()
		log.Errorf("Snapshot %s: not written: %v", path, err)
		return
	}
	log.Infof("Snapshot %s: %d entries written in %v", path, n, time.Since(start).Round(time.Millisecond))
}

func (c *Cache) writeSnapshotFile(path string, walk store.Walker) (int, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	n, err := snapshot.Write(tmp, walk, c.fingerprint(), c.now().Unix())
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
