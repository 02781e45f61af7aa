// Command zonegen writes the end-to-end benchmark's input: a zone holding the
// first N entries of the reference workload (internal/workload) and two dnsperf
// query files that ask for them.
//
//	zonegen -n 200000 -dir DIR
//
// writes
//
//   - DIR/zone.db: the root zone "." with an SOA, an NS and, for each entry
//     i < N, the records workload.Reply(i, Plain) answers with (1 to 4 A, AAAA
//     or TXT records owned by the qname, TTL 3600);
//   - DIR/fill.txt: one "qname qtype" line per entry in the order 0..N-1, to
//     fill a cache with one pass;
//   - DIR/hit.txt: the same lines in a fixed random order, so that hits do not
//     walk a cache's memory in the order it was filled.
//
// Served by CoreDNS's file plugin behind the minimal plugin (answer section
// only), the zone answers every query of the files with the reply
// workload.Reply gives.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
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

func main() {
	n := flag.Int("n", 200_000, "entries of the reference workload: 0..n-1")
	dir := flag.String("dir", ".", "directory to write zone.db, fill.txt and hit.txt into")
	seed := flag.Uint64("seed", 1, "seed of hit.txt's order")
	flag.Parse()
	if *n < 1 {
		log.Fatalf("zonegen: -n %d: want at least 1", *n)
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		log.Fatal(err)
	}
	write := func(name string, f func(io.Writer) error) {
		path := filepath.Join(*dir, name)
		out, err := os.Create(path)
		if err != nil {
			log.Fatal(err)
		}
		w := bufio.NewWriterSize(out, 1<<20)
		if err := f(w); err != nil {
			log.Fatalf("%s: %v", path, err)
		}
		if err := w.Flush(); err != nil {
			log.Fatalf("%s: %v", path, err)
		}
		if err := out.Close(); err != nil {
			log.Fatalf("%s: %v", path, err)
		}
	}
	write("zone.db", func(w io.Writer) error { return writeZone(w, *n) })
	write("fill.txt", func(w io.Writer) error { return writeQueries(w, fillOrder(*n)) })
	write("hit.txt", func(w io.Writer) error { return writeQueries(w, hitOrder(*n, *seed)) })
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
