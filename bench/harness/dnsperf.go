//go:build linux

package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Perf is what one dnsperf run reports.
type Perf struct {
	Sent      int
	Completed int
	Lost      int
	QPS       float64
	Seconds   float64 // dnsperf's run time
	AvgLatUS  float64
	RespBytes float64 // average response size
	Rcodes    string
	ClientCPU time.Duration // dnsperf's own user+system time
	Lat       *Latency      // per-query latencies, with -v only
}

// Latency summarises per-query latencies in microseconds.
type Latency struct {
	N                        int // answered queries
	Timeouts                 int
	P50, P90, P99, P999, Max float64
	Mean                     float64
}

// DNSPerf runs the command line argv: dnsperf and its arguments, maybe
// behind nice, taskset or chrt (Pinned). Its output goes to logPath, less
// the per-query lines of -v, which it reduces to percentiles.
func DNSPerf(ctx context.Context, argv []string, logPath string) (Perf, error) {
	verbose := slices.Contains(argv, "-v")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	logf, err := os.Create(logPath)
	if err != nil {
		return Perf{}, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "# %s\n", strings.Join(argv, " "))
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return Perf{}, err
	}
	if err := cmd.Start(); err != nil {
		return Perf{}, err
	}
	res, perr := parseDNSPerf(stdout, logf, verbose)
	werr := cmd.Wait()
	if cmd.ProcessState != nil {
		res.ClientCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	if werr != nil {
		return res, fmt.Errorf("dnsperf: %v (see %s)", werr, logPath)
	}
	if perr != nil {
		return res, fmt.Errorf("dnsperf output: %v (see %s)", perr, logPath)
	}
	if res.Sent == 0 {
		return res, fmt.Errorf("dnsperf sent no query (see %s)", logPath)
	}
	return res, nil
}

// parseDNSPerf reads dnsperf's output. Lines of -v ("> NOERROR name type
// 0.000123", "> T name type" for a timeout) become latency samples; the
// other lines are copied to log and the statistics at the end are parsed.
func parseDNSPerf(r io.Reader, log io.Writer, verbose bool) (Perf, error) {
	var res Perf
	var lat []float64
	timeouts := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "> ") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[1] == "T" {
				timeouts++
				continue
			}
			if len(f) < 5 {
				continue
			}
			s, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				continue
			}
			lat = append(lat, s*1e6)
			continue
		}
		if log != nil {
			fmt.Fprintln(log, line)
		}
		key, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		first := ""
		if f := strings.Fields(val); len(f) > 0 {
			first = f[0]
		}
		switch key {
		case "Queries sent":
			res.Sent, _ = strconv.Atoi(first)
		case "Queries completed":
			res.Completed, _ = strconv.Atoi(first)
		case "Queries lost":
			res.Lost, _ = strconv.Atoi(first)
		case "Queries per second":
			res.QPS, _ = strconv.ParseFloat(first, 64)
		case "Run time (s)":
			res.Seconds, _ = strconv.ParseFloat(first, 64)
		case "Average Latency (s)":
			s, _ := strconv.ParseFloat(first, 64)
			res.AvgLatUS = s * 1e6
		case "Response codes":
			res.Rcodes = val
		case "Average packet size":
			// "request 38, response 96"
			if i := strings.LastIndex(val, "response "); i >= 0 {
				res.RespBytes, _ = strconv.ParseFloat(strings.TrimSpace(val[i+len("response "):]), 64)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return res, err
	}
	if verbose {
		res.Lat = summarize(lat, timeouts)
	}
	return res, nil
}

// summarize sorts the samples and takes the percentiles (nearest rank).
func summarize(samples []float64, timeouts int) *Latency {
	l := &Latency{N: len(samples), Timeouts: timeouts}
	if len(samples) == 0 {
		return l
	}
	slices.Sort(samples)
	sum := 0.0
	for _, s := range samples {
		sum += s
	}
	l.Mean = sum / float64(len(samples))
	l.P50 = percentile(samples, 50)
	l.P90 = percentile(samples, 90)
	l.P99 = percentile(samples, 99)
	l.P999 = percentile(samples, 99.9)
	l.Max = samples[len(samples)-1]
	return l
}

// percentile returns the nearest-rank p-th percentile of sorted samples.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p*float64(len(sorted))/100 - 1e-9)) // no rounding up of an exact rank
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}
