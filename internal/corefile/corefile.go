// Package corefile reads what the options of a compactcache block share
// in the Corefile's syntax: an option's `{ }` block of settings. The
// packages whose options have blocks (config, frontend, adminserver,
// persist, tier, kube) read them here, one way.
package corefile

import "github.com/coredns/caddy"

// Block reads the `{ }` block of the option c is on, if one follows its
// arguments on its line, calling each with every line's option and
// arguments and stopping at its error. Call it once RemainingArgs has
// taken the option's arguments: they stop before the brace. It reads the
// block token by token: the dispenser's NextBlock would take the options
// after a block-less option for its own.
func Block(c *caddy.Controller, each func(opt string, args []string) error) error {
	if !c.NextArg() {
		return nil
	}
	for c.Next() && c.Val() != "}" {
		if err := each(c.Val(), c.RemainingArgs()); err != nil {
			return err
		}
	}
	return nil
}
