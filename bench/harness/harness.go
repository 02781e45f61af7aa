// Package harness is what the bench commands share beyond the in-process
// caches of package bench: their command line and the lines they print
// (cli.go), the custom CoreDNS build built and started as a process,
// pinned to a CPU and at a niceness of the run's choosing (build.go,
// proc.go), DNS servers of their own in the tool's process (serve.go), the
// load they drive a server with, open loop from Go (openloop.go) or dnsperf
// (dnsperf.go), and what Linux says of the processes and the machine: CPU
// time and resident memory from /proc (proc.go, stat.go). Plotting is in
// harness/figure.
package harness
