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

// row is one cache's figures at one N: a line of the -csv file and a point
// of the -plot figure.
type row struct {
	Cache                 bench.Kind
	N                     int
	Raw                   bool    // compactcache's hits through w.Write (-raw)
	HeapInuse, HeapAlloc  float64 // bytes per entry, the store's mapped memory included
	Objects               float64 // heap objects per entry
	StoreBytes            float64 // compactcache's Stats().Bytes per entry
	Payload               float64 // per entry
	InsertNs, InsertAlloc float64 // the cache's own share of an insert: median ns of the blocks, mean allocations
	HitNs, HitAllocs      float64 // a hit with the reply packed
	HitUnpackedNs         float64 // a hit, the writer's packing left out
	ReadNs                float64 // a dependent random read over as many bytes (0: not measured)
}

var header = []string{"cache", "n", "raw", "heap_inuse_per_entry", "heap_alloc_per_entry", "heap_objects_per_entry",
	"store_bytes_per_entry", "payload_per_entry", "insert_own_ns", "insert_own_allocs", "hit_ns", "hit_allocs", "hit_unpacked_ns", "read_ns"}

func (r row) record() []string {
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	return []string{string(r.Cache), strconv.Itoa(r.N), strconv.FormatBool(r.Raw), f(r.HeapInuse, 1), f(r.HeapAlloc, 1), f(r.Objects, 2),
		f(r.StoreBytes, 1), f(r.Payload, 1), f(r.InsertNs, 0), f(r.InsertAlloc, 2), f(r.HitNs, 0), f(r.HitAllocs, 2), f(r.HitUnpackedNs, 0), f(r.ReadNs, 0)}
}

// rows returns the figures of the caches measured without a failure.
func (r *results) rows(cfg config) []row {
	var rows []row
	for _, k := range r.ok(cfg) {
		f := r.figs[k]
		own := f.insert.minus(f.upstream)
		rows = append(rows, row{Cache: k, N: cfg.n, Raw: cfg.raw && k == bench.Compact,
			HeapInuse: f.heapInuse, HeapAlloc: f.heapAlloc, Objects: f.objects, StoreBytes: f.storeBytes, Payload: f.payload,
			InsertNs: f.own.median, InsertAlloc: own.allocs, HitNs: f.hit.ns, HitAllocs: f.hit.allocs, HitUnpackedNs: f.hitUnpacked.ns, ReadNs: f.readNs})
	}
	return rows
}

// runEach runs this command once for each N of ns, in a child of its own
// with args and -n N, so that no two heaps mix; each child prints its table
// on stdout and leaves its rows in a file. A child that fails fails the
// run once the others are done.
func runEach(ns []int, args []string) ([]row, error) {
	dir, err := os.MkdirTemp("", "report")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var rows []row
	var failed error
	for _, n := range ns {
		cmd.Progress("N = %d, in a child", n)
		path := filepath.Join(dir, fmt.Sprintf("rows-%d.json", n))
		c := exec.Command(os.Args[0], append(args, "-n", strconv.Itoa(n), "-rows", path)...)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Run(); err != nil {
			failed = fmt.Errorf("the child for N = %d: %v", n, err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var rs []row
		if err := json.Unmarshal(b, &rs); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		rows = append(rows, rs...)
	}
	return rows, failed
}

func writeRows(path string, rows []row) error {
	b, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
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
	// A CSV of a report without read_ns has one column less.
	if len(recs) == 0 || (len(recs[0]) != len(header) && len(recs[0]) != len(header)-1) {
		return nil, fmt.Errorf("%s: not a report's CSV (want the header %v)", path, header)
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
		r.Cache, r.N = bench.Kind(rec[0]), int(num(rec[1]))
		r.Raw, err = strconv.ParseBool(rec[2])
		errs = append(errs, err)
		r.HeapInuse, r.HeapAlloc, r.Objects = num(rec[3]), num(rec[4]), num(rec[5])
		r.StoreBytes, r.Payload = num(rec[6]), num(rec[7])
		r.InsertNs, r.InsertAlloc = num(rec[8]), num(rec[9])
		r.HitNs, r.HitAllocs, r.HitUnpackedNs = num(rec[10]), num(rec[11]), num(rec[12])
		if len(rec) > 13 {
			r.ReadNs = num(rec[13])
		}
		for _, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %v", path, k+2, err)
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}
