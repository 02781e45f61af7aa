package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Test    string
	Output  string
	Elapsed float64
}

// result is what go test -json said about one test or subtest.
type result struct {
	ran     bool
	action  string // pass, fail or skip; "" if the test never ended
	elapsed float64
	output  []string
}

// results gathers the events of a go test -json run.
type results struct {
	tests map[string]*result // by full name, subtests as Test/sub
	order []string           // names in the order they started
	other []string           // output not inside a test: build errors, panics
}

// read reads go test -json from r until it ends. Lines that are not JSON
// (go test's own complaints) are kept as other output. progress, if not nil,
// gets each top-level test as it ends; verbose, if not nil, gets all output.
func (rs *results) read(r io.Reader, progress func(name string, res *result), verbose io.Writer) error {
	if rs.tests == nil {
		rs.tests = map[string]*result{}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			rs.other = append(rs.other, string(line))
			if verbose != nil {
				fmt.Fprintf(verbose, "%s\n", line)
			}
			continue
		}
		if verbose != nil && e.Output != "" {
			io.WriteString(verbose, e.Output)
		}
		if e.Test == "" {
			if e.Output != "" {
				rs.other = append(rs.other, strings.TrimSuffix(e.Output, "\n"))
			}
			continue
		}
		res := rs.tests[e.Test]
		if res == nil {
			res = &result{}
			rs.tests[e.Test] = res
			rs.order = append(rs.order, e.Test)
		}
		switch e.Action {
		case "run":
			res.ran = true
		case "output":
			res.output = append(res.output, strings.TrimSuffix(e.Output, "\n"))
		case "pass", "fail", "skip":
			res.action, res.elapsed = e.Action, e.Elapsed
			if progress != nil && !strings.Contains(e.Test, "/") {
				progress(e.Test, res)
			}
		}
	}
	return sc.Err()
}

// message matches the lines t.Error, t.Fatal and t.Log write: the file and
// line, indented under the test's name.
var message = regexp.MustCompile(`^\s+\S+\.go:\d+: `)

// messages returns what a test wrote through t.Error, t.Fatal or t.Log, with
// the lines that continue a message, and without go test's own === and ---
// lines.
func (r *result) messages() []string {
	var out []string
	in := false
	for _, l := range r.output {
		t := strings.TrimSpace(l)
		switch {
		case message.MatchString(l):
			in = true
			out = append(out, t)
		case strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- "):
			in = false
		case in && t != "":
			out = append(out, "  "+t)
		}
	}
	return out
}

// failures returns the top-level test name and those of its subtests that
// failed, the deepest first.
func (rs *results) failures(name string) []string {
	var out []string
	for _, n := range rs.order {
		if (n == name || strings.HasPrefix(n, name+"/")) && rs.tests[n].action == "fail" {
			out = append(out, n)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	return out
}

// verdict is the outcome of one named test.
type verdict struct {
	name    string
	ok      bool
	status  string   // PASS, FAIL, SKIP (the test skipped itself), NOT RUN, NO RESULT
	reasons []string // for a test that is not ok, one line or more each
}

// judge returns the verdict on each name, in that order: ok only if the test
// ran and passed. For a failure the reasons are the messages of each failed
// subtest, which are what says why.
func (rs *results) judge(names []string) []verdict {
	var out []verdict
	for _, name := range names {
		v := verdict{name: name}
		res := rs.tests[name]
		switch {
		case res == nil || !res.ran:
			v.status = "NOT RUN"
			v.reasons = []string{"go test did not start it"}
		case res.action == "pass":
			v.ok, v.status = true, "PASS"
		case res.action == "skip":
			v.status = "SKIP"
			v.reasons = append([]string{"skipped itself:"}, res.messages()...)
		case res.action == "fail":
			v.status = "FAIL"
			// A failed subtest fails its parents, which mostly have
			// nothing to say of their own.
			for _, f := range rs.failures(name) {
				msgs := rs.tests[f].messages()
				if len(msgs) == 0 {
					continue
				}
				v.reasons = append(v.reasons, f+":")
				for _, m := range msgs {
					v.reasons = append(v.reasons, "  "+m)
				}
			}
			if len(v.reasons) == 0 {
				// A panic, say: its trace is in the output.
				v.reasons = append([]string{"failed without a message; its output ends:"}, rs.tail(name)...)
			}
		default:
			v.status = "NO RESULT"
			v.reasons = append([]string{"started but never ended: the test binary crashed or timed out; its output ends:"}, rs.tail(name)...)
		}
		out = append(out, v)
	}
	return out
}

// tail returns the last lines the test name and its subtests wrote, indented.
func (rs *results) tail(name string) []string {
	const n = 20
	var out []string
	for _, t := range rs.order {
		if t == name || strings.HasPrefix(t, name+"/") {
			out = append(out, rs.tests[t].output...)
		}
	}
	out = out[max(0, len(out)-n):]
	for i, l := range out {
		out[i] = "  " + l
	}
	return out
}
