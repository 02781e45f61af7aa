// Package cli is what the bench commands that run children of their own
// share of their command line: a usage text that leaves out the flags the
// command only gives its children, and the lines it prints on stderr.
package cli

import (
	"flag"
	"fmt"
	"os"
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
