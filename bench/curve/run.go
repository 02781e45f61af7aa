package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/compactcache/compactcache/bench"
)

// row is one line of curve.csv: a cache's figures at one N on one hit path.
// The memory figures are the (cache, N) child's, the same on both of
// compactcache's paths. Hits is per pass.
type row struct {
	Cache      bench.Kind
	Path       string
	N          int
	HeapInuse  float64 // bytes per entry
	HeapAlloc  float64
	Objects    float64
	StoreBytes float64 // compactcache's Stats().Bytes per entry, 0 for the stock cache
	Payload    float64
	HitNs      float64 // wall time
	HitCPUNs   float64 // the process's CPU time
	HitBestNs  float64 // wall time in the fastest round
	HitAllocs  float64
	HitBytes   float64
	Hits       int
	Rounds     int
	Passes     int
	Others     float64 // share of the cores busy with other work during the hits
}

var header = []string{"cache", "path", "n", "heap_inuse_per_entry", "heap_alloc_per_entry", "heap_objects_per_entry",
	"store_bytes_per_entry", "payload_per_entry", "hit_best_ns_op", "hit_ns_op", "hit_cpu_ns_op", "hit_allocs_op", "hit_bytes_op", "hits", "rounds", "passes", "others_cpu_share"}

func (r row) record() []string {
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	return []string{string(r.Cache), r.Path, strconv.Itoa(r.N), f(r.HeapInuse, 1), f(r.HeapAlloc, 1), f(r.Objects, 2),
		f(r.StoreBytes, 1), f(r.Payload, 1), f(r.HitBestNs, 0), f(r.HitNs, 0), f(r.HitCPUNs, 0), f(r.HitAllocs, 2), f(r.HitBytes, 0), strconv.Itoa(r.Hits), strconv.Itoa(r.Rounds), strconv.Itoa(r.Passes), f(r.Others, 2)}
}

// run measures every (cache, N) in a child of its own, one after the other,
// and writes curve.csv and curve.png.
func run(cfg config) error {
	type job struct {
		kind bench.Kind
		n    int
	}
	var jobs []job
	for _, n := range cfg.compact {
		jobs = append(jobs, job{bench.Compact, n})
	}
	for _, n := range cfg.stock {
		jobs = append(jobs, job{bench.Stock, n})
	}
	var rows []row
	for _, j := range jobs {
		if cfg.quietWait > 0 {
			waited, others := waitQuiet(cfg.quietWait)
			if others >= quietShare {
				cmd.Progress("%s, N=%d: other work keeps %.0f%% of the cores busy after %v of waiting; measuring anyway",
					j.kind, j.n, 100*others, waited.Round(1e9))
			}
		}
		cmd.Progress("%s, N=%d: filling, verifying, timing %d passes of %d hits per path, in a child", j.kind, j.n, cfg.passes, cfg.hits)
		r, err := spawn(j.kind, j.n, cfg)
		if err != nil {
			return err
		}
		for _, path := range []string{pathRaw, pathWriteMsg} {
			h, ok := r.Hits[path]
			if !ok {
				continue
			}
			rw := row{Cache: j.kind, Path: path, N: j.n, HeapInuse: r.HeapInuse, HeapAlloc: r.HeapAlloc, Objects: r.Objects,
				StoreBytes: r.StoreBytes, Payload: r.Payload, HitBestNs: h.BestNs, HitNs: h.Ns, HitCPUNs: h.CPUNs, HitAllocs: h.Allocs,
				HitBytes: h.Bytes, Hits: roundLen(cfg.hits, cfg.rounds) * cfg.rounds, Rounds: cfg.rounds, Passes: cfg.passes, Others: h.Others}
			cmd.Progress("  %s %s N=%d: %.0f bytes/entry (HeapInuse), hit %.0f ns/op in the fastest round, %.0f mean (CPU %.0f), %.2f allocs/op, other work %.0f%% of the cores",
				j.kind, path, j.n, rw.HeapInuse, rw.HitBestNs, rw.HitNs, rw.HitCPUNs, rw.HitAllocs, 100*rw.Others)
			rows = append(rows, rw)
		}
	}
	csvPath := filepath.Join(cfg.dir, "curve.csv")
	if err := writeCSV(csvPath, rows); err != nil {
		return err
	}
	pngPath := filepath.Join(cfg.dir, "curve.png")
	if err := writePNG(pngPath, rows); err != nil {
		return err
	}
	cmd.Progress("wrote %s and %s", csvPath, pngPath)
	return nil
}

// spawn re-executes this program as the child measuring kind at n and
// decodes what it prints. The child's stderr is the parent's.
func spawn(kind bench.Kind, n int, cfg config) (childResult, error) {
	args := []string{"-child", string(kind), "-n", strconv.Itoa(n), "-hits", strconv.Itoa(cfg.hits),
		"-rounds", strconv.Itoa(cfg.rounds), "-passes", strconv.Itoa(cfg.passes)}
	cmd := exec.Command(os.Args[0], args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	var r childResult
	if err := cmd.Run(); err != nil {
		return r, fmt.Errorf("child %v: %v", args, err)
	}
	return r, json.Unmarshal(out.Bytes(), &r)
}

func writeCSV(path string, rows []row) error {
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	w.Write(header)
	for _, r := range rows {
		w.Write(r.record())
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func readCSV(path string) ([]row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 || len(recs[0]) != len(header) {
		return nil, fmt.Errorf("%s: not a curve.csv (want the header %v)", path, header)
	}
	var rows []row
	for k, rec := range recs[1:] {
		var (
			r    row
			errs []error
		)
		num := func(s string) float64 {
			v, err := strconv.ParseFloat(s, 64)
			errs = append(errs, err)
			return v
		}
		r.Cache, r.Path = bench.Kind(rec[0]), rec[1]
		r.N = int(num(rec[2]))
		r.HeapInuse, r.HeapAlloc, r.Objects = num(rec[3]), num(rec[4]), num(rec[5])
		r.StoreBytes, r.Payload = num(rec[6]), num(rec[7])
		r.HitBestNs, r.HitNs, r.HitCPUNs = num(rec[8]), num(rec[9]), num(rec[10])
		r.HitAllocs, r.HitBytes = num(rec[11]), num(rec[12])
		r.Hits, r.Rounds, r.Passes = int(num(rec[13])), int(num(rec[14])), int(num(rec[15]))
		r.Others = num(rec[16])
		for _, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %v", path, k+2, err)
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}
