//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/compactcache/compactcache/internal/workload"
	"github.com/miekg/dns"
)

// zoneHead is the apex of the zone: an SOA (negative TTL 3600) and one NS
// whose name lives in the zone.
const zoneHead = `$ORIGIN .
$TTL 3600
.	3600	IN	SOA	ns.e2e.invalid. hostmaster.e2e.invalid. 1 7200 3600 1209600 3600
.	3600	IN	NS	ns.e2e.invalid.
ns.e2e.invalid.	3600	IN	A	127.0.0.1
`

// writeData writes the run's input into dir: a zone holding the first n
// entries of the reference workload and two dnsperf query files that ask
// for them.
//
//   - zone.db: the root zone "." with an SOA, an NS and, for each entry
//     i < n, the records workload.Reply(i, Plain) answers with (1 to 4 A,
//     AAAA or TXT records owned by the qname, TTL 3600);
//   - fill.txt: one "qname qtype" line per entry in the order 0..n-1, to
//     fill a cache with one pass;
//   - hit.txt: the same lines in a fixed random order (seed), so that hits
//     do not walk a cache's memory in the order it was filled.
//
// Served by CoreDNS's file plugin behind the minimal plugin (answer section
// only), the zone answers every query of the files with the reply
// workload.Reply gives.
func writeData(dir string, n int, seed uint64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	write := func(name string, f func(io.Writer) error) error {
		path := filepath.Join(dir, name)
		out, err := os.Create(path)
		if err != nil {
			return err
		}
		w := bufio.NewWriterSize(out, 1<<20)
		err = f(w)
		if err == nil {
			err = w.Flush()
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
		return nil
	}
	if err := write("zone.db", func(w io.Writer) error { return writeZone(w, n) }); err != nil {
		return err
	}
	if err := write("fill.txt", func(w io.Writer) error { return writeQueries(w, fillOrder(n)) }); err != nil {
		return err
	}
	return write("hit.txt", func(w io.Writer) error { return writeQueries(w, hitOrder(n, seed)) })
}

// writeZone writes the zone of entries [0, n).
func writeZone(w io.Writer, n int) error {
	if _, err := io.WriteString(w, zoneHead); err != nil {
		return err
	}
	for i := range n {
		for _, rr := range workload.Reply(i, workload.Plain).Answer {
			if _, err := fmt.Fprintln(w, rr.String()); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeQueries writes one dnsperf query line per entry of order.
func writeQueries(w io.Writer, order []int) error {
	b := make([]byte, 0, 64)
	for _, i := range order {
		b = workload.AppendName(b[:0], i)
		b = append(b, ' ')
		b = append(b, dns.TypeToString[workload.Qtype(i)]...)
		b = append(b, '\n')
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

func fillOrder(n int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	return order
}

func hitOrder(n int, seed uint64) []int {
	return rand.New(rand.NewPCG(seed, 0x636f6d7061637463)).Perm(n)
}
