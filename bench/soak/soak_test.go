//go:build linux

package main

import (
	"encoding/csv"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func TestParseDNSPerf(t *testing.T) {
	p := parseDNSPerf(`Statistics:

  Queries sent:         100010
  Queries completed:    100000 (99.99%)
  Queries lost:         10 (0.01%)

  Response codes:       NOERROR 99990 (99.99%), SERVFAIL 7 (0.01%), REFUSED 3 (0.00%)
  Average packet size:  request 38, response 96
  Run time (s):         10.000234
  Queries per second:   9999.766
`)
	if p.Sent != 100010 || p.Completed != 100000 || p.Lost != 10 || p.Seconds != 10.000234 || p.QPS != 9999.766 {
		t.Errorf("parsed %+v", p)
	}
	if p.rcodes["NOERROR"] != 99990 || p.rcodes["SERVFAIL"] != 7 || p.rcodes["REFUSED"] != 3 {
		t.Errorf("rcodes %v", p.rcodes)
	}
}

// TestPlot writes a CSV of made-up samples, reads it back and draws it.
func TestPlot(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "soak.csv")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config{capacity: "8MiB", names: 1000, skew: 0.9, qps: 100}
	w := csv.NewWriter(f)
	w.Write(csvHeader)
	var want []sample
	for i := range 61 {
		s := sample{Elapsed: float64(10 * i), Interval: 10, RSS: int64(40+i%7) << 20, HeapInuse: 20 << 20, StoreBytes: 8 << 20,
			Capacity: 8 << 20, QPS: 9000 + float64(i%5)*100, Lost: int64(i % 3), Hits: 50000, Misses: 40000}
		want = append(want, s)
		w.Write(s.row(cfg))
	}
	w.Flush()
	if err := w.Error(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got, err := readCSV(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || got[60].RSS != want[60].RSS || got[60].QPS != want[60].QPS || got[2].Lost != 2 {
		t.Fatalf("read back %d samples, last %+v", len(got), got[len(got)-1])
	}
	img := filepath.Join(dir, "soak.png")
	if err := renderPNG(img, plotTitle, got[0].Config, got); err != nil {
		t.Fatal(err)
	}
	pf, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	if _, err := png.Decode(pf); err != nil {
		t.Fatal(err)
	}
}
