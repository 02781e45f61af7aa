package harness

// What the bench commands share of their command line: a usage text that
// leaves out the flags a command only gives its children, the lines they
// print on stderr, and what they say of the machine and the plugin's state
// a table was printed at.

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Command is a bench command, by the name its lines on stderr start with.
type Command string

// internal starts the usage of a flag that the command gives only its own
// children.
const internal = "internal:"

// Usage prints how to run the command and its flags, but the internal ones.
func (c Command) Usage(fs *flag.FlagSet) {
	out := fs.Output()
	fmt.Fprintf(out, "Usage: go run ./bench/%s [flags]\n\n", c)
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, internal) {
			return
		}
		fmt.Fprintf(out, "  -%s\t%s (default %s)\n", f.Name, f.Usage, f.DefValue)
	})
}

// Fatal prints err and exits with status 1.
func (c Command) Fatal(err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", c, err)
	os.Exit(1)
}

// Progress tells the user, on stderr, what the minutes are spent on.
func (c Command) Progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s: "+format+"\n", append([]any{c}, args...)...)
}

// CPUModel returns the processor's name, as Linux reports it.
func CPUModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for line := range strings.Lines(string(b)) {
		if name, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimLeft(name, " \t:"))
		}
	}
	return "unknown CPU"
}

// Revision describes the working tree as a command starts (the build is not
// stamped: go run and GOFLAGS=-buildvcs=false leave no VCS information), so
// that a pasted table says which state of the plugin it measured.
func Revision() string {
	out, err := exec.Command("git", "log", "-1", "--format=%h %s").Output()
	if err != nil {
		return "unknown (no git)"
	}
	rev := strings.TrimSpace(string(out))
	if dirty, _ := exec.Command("git", "status", "--porcelain", "--", "*.go", ":!bench").Output(); len(dirty) > 0 {
		rev += fmt.Sprintf(" + %d uncommitted .go files", len(strings.Split(strings.TrimSpace(string(dirty)), "\n")))
	}
	return rev
}
