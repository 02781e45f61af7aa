// Command corednstests runs the integration tests of CoreDNS's own test/
// directory that use the cache plugin against compactcache instead, and fails
// unless every one of them ran and passed.
//
//	go run ./internal/corednstests        # from anywhere in the repository
//	go run ./internal/corednstests -v     # with the tests' output as they run
//
// The tests are those of the CoreDNS version go.mod requires, copied from the
// module cache into a temporary directory and changed in two ways only: in
// their Corefiles the directive cache becomes compactcache, and one file is
// added that registers compactcache where cache stands in the directive list,
// as cmd/coredns does. Their go.mod is the repository's, with compactcache
// replaced by this checkout, so the tests build against the same versions of
// everything as the plugin does.
//
// Tests that send queries off the machine are skipped by name, each with its
// reason printed: they would test the network, and CI has none.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// named are the tests of CoreDNS's test/ directory that use cache, as issue
// 19 lists them. A trailing * stands for any rest of the name; each pattern
// must match at least one test, so that a test renamed in a later CoreDNS is
// noticed rather than silently dropped.
var named = []string{
	"TestLookupCache*",
	"TestLookupCacheWithoutEdns",
	"TestIssue7630",
	"TestCacheACLAuthorization",
	"TestMetrics*",
	"TestDynUpdateIsNotServedFromCache",
	"TestKubernetesAutopathCacheRefresh",
}

// skipped are the named tests that send queries off the machine, with why.
// Each forwards to 8.8.8.8 a query that reaches the forward plugin: with no
// network the result depends on how the machine drops the packets (an
// immediate SERVFAIL, or a client timeout that fails the test), and with one
// it depends on Google's resolver. TestMetricsSeveralBlocs also names 8.8.8.8
// but only in a block it sends nothing to, so it runs.
var skipped = map[string]string{
	"TestMetricsRewriteRequestSize":                  "forwards its queries to 8.8.8.8 (and has no cache in its Corefiles)",
	"TestMetricsAvailable":                           "forwards its query for www.example.org to 8.8.8.8 over TCP",
	"TestMetricsAvailableAfterReload":                "forwards its query for www.example.org to 8.8.8.8 over TCP",
	"TestMetricsAvailableAfterReloadAndFailedReload": "forwards its query for www.example.org to 8.8.8.8 over TCP",
}

const (
	module      = "github.com/compactcache/compactcache"
	corednsMod  = "github.com/coredns/coredns"
	addedFile   = "compactcache.go"
	testTimeout = "20m"
)

func main() {
	verbose := flag.Bool("v", false, "print the tests' output as they run")
	keep := flag.Bool("keep", false, "keep the temporary directory with the changed tests, to run them by hand")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./internal/corednstests [-v] [-keep]\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	ok, err := run(*verbose, *keep)
	if err != nil {
		fmt.Fprintln(os.Stderr, "corednstests:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// run does it all; it returns false when a named test did not pass, and an
// error when it could not get as far as running them.
func run(verbose, keep bool) (bool, error) {
	root, err := repoRoot()
	if err != nil {
		return false, err
	}
	version, src, err := corednsTests(root)
	if err != nil {
		return false, err
	}
	tmp, err := os.MkdirTemp("", "corednstests-")
	if err != nil {
		return false, err
	}
	if keep {
		defer fmt.Printf("\nkept %s\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	dir := filepath.Join(tmp, "test")
	fmt.Printf("CoreDNS %s: %s\ncopied to %s\n", version, src, dir)
	if err := copyDir(src, dir); err != nil {
		return false, err
	}

	tests, err := findTests(dir)
	if err != nil {
		return false, err
	}
	names, err := expand(named, tests)
	if err != nil {
		return false, err
	}
	for name := range skipped {
		if !slices.Contains(names, name) {
			return false, fmt.Errorf("%s is listed as skipped but is not a named test", name)
		}
	}

	fmt.Printf("\ndirective cache switched to compactcache:\n")
	perFile, err := switchFiles(dir)
	if err != nil {
		return false, err
	}
	// A named test's file with no directive switched would run the stock
	// cache, or none, and prove nothing about compactcache.
	var missing []string
	for _, name := range names {
		if f := tests[name].file; perFile[f] == 0 && !slices.Contains(missing, f) {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return false, fmt.Errorf("no cache directive found in %s, which hold named tests", strings.Join(missing, ", "))
	}

	pkg := tests[names[0]].pkg
	if err := addRegistration(dir, pkg); err != nil {
		return false, err
	}
	fmt.Printf("\nadded %s: compactcache before cache in dnsserver.Directives\n", addedFile)
	if err := writeGoMod(root, dir); err != nil {
		return false, err
	}

	var toRun, skip []string
	fmt.Printf("\nnamed tests (%d):\n", len(names))
	for _, name := range names {
		if why, ok := skipped[name]; ok {
			fmt.Printf("  %-48s %-34s skipped: %s\n", name, tests[name].file, why)
			skip = append(skip, name)
			continue
		}
		fmt.Printf("  %-48s %s\n", name, tests[name].file)
		toRun = append(toRun, name)
	}

	return goTest(dir, toRun, skip, verbose)
}

// repoRoot returns the directory of the compactcache module, from anywhere
// inside it.
func repoRoot() (string, error) {
	out, err := goCmd("", "list", "-m", "-f", "{{.Path}} {{.Dir}}")
	if err != nil {
		return "", err
	}
	path, dir, _ := strings.Cut(strings.TrimSpace(out), " ")
	if path != module {
		return "", fmt.Errorf("run from inside the compactcache repository (the module here is %q)", path)
	}
	return dir, nil
}

// corednsTests returns the CoreDNS version go.mod requires and its test/
// directory in the module cache, downloading the module if it is not there.
func corednsTests(root string) (version, dir string, err error) {
	out, err := goCmd(root, "mod", "download", "-json", corednsMod)
	if err != nil {
		return "", "", err
	}
	var m struct{ Version, Dir, Error string }
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		return "", "", fmt.Errorf("go mod download %s: %v", corednsMod, err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", "", fmt.Errorf("go mod download %s: %s", corednsMod, m.Error)
	}
	return m.Version, filepath.Join(m.Dir, "test"), nil
}

// copyDir copies the files of src into a new directory dst, writable: the
// module cache keeps them read-only. test/ has no subdirectories; one in a
// later CoreDNS is refused rather than half copied.
func copyDir(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			return fmt.Errorf("%s: %s is not a regular file; copying only files", src, e.Name())
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// testFunc is where a test function is declared.
type testFunc struct{ file, pkg string }

// testName matches the names go test runs as tests.
var testName = regexp.MustCompile(`^Test([^a-z].*)?$`)

// findTests returns the top-level test functions of the _test.go files in
// dir, with the file each is in.
func findTests(dir string) (map[string]testFunc, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	tests := map[string]testFunc{}
	fset := token.NewFileSet()
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, decl := range f.Decls {
			if d, ok := decl.(*ast.FuncDecl); ok && d.Recv == nil && testName.MatchString(d.Name.Name) {
				tests[d.Name.Name] = testFunc{filepath.Base(path), f.Name.Name}
			}
		}
	}
	return tests, nil
}

// expand returns the tests the patterns name, sorted, each once.
func expand(patterns []string, tests map[string]testFunc) ([]string, error) {
	var names []string
	for _, p := range patterns {
		prefix, star := strings.CutSuffix(p, "*")
		n := 0
		for name := range tests {
			if name == p || star && strings.HasPrefix(name, prefix) {
				n++
				if !slices.Contains(names, name) {
					names = append(names, name)
				}
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("no test matches %s", p)
		}
	}
	slices.Sort(names)
	return names, nil
}

// switchFiles switches the directive in every Go file of dir, named tests'
// or not: they are one package, and the same Corefile text should mean the
// same cache everywhere in it. It prints the count of each file that has
// any, and returns the counts by file.
func switchFiles(dir string) (map[string]int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for _, path := range files {
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		out, n, funcs, err := switchDirective(path, src)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			continue
		}
		if err := os.WriteFile(path, out, 0o644); err != nil {
			return nil, err
		}
		base := filepath.Base(path)
		counts[base] = n
		funcs = slices.Compact(funcs)
		for i, f := range funcs {
			if f == "" {
				funcs[i] = "(outside functions)"
			}
		}
		fmt.Printf("  %-34s %2d  in %s\n", base, n, strings.Join(funcs, ", "))
	}
	return counts, nil
}

// addRegistration writes the one added file.
func addRegistration(dir, pkg string) error {
	path := filepath.Join(dir, addedFile)
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("CoreDNS's test/ has a %s of its own; pick another name for the added file", addedFile)
	}
	return os.WriteFile(path, registrationFile(pkg), 0o644)
}

// writeGoMod gives dir the repository's go.mod and go.sum, as another module
// that requires compactcache from the checkout at root. With the
// repository's requirements the tests build against the versions the plugin
// is built and tested with, and its go.sum already vouches for them, so no
// checksum needs the network. The few modules only CoreDNS's tests import
// (pebble, for acme_test.go) are added by go test -mod=mod, from the module
// cache or, on a cold one, from the proxy, as any go test would.
func writeGoMod(root, dir string) error {
	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	_, err := goCmd(dir, "mod", "edit",
		"-module=corednstests",
		"-require="+module+"@v0.0.0",
		"-replace="+module+"="+root)
	return err
}

// goTest runs the tests and judges them.
func goTest(dir string, run, skip []string, verbose bool) (bool, error) {
	args := []string{"test", "-json", "-count=1", "-timeout=" + testTimeout, "-run=" + anchored(run)}
	if len(skip) > 0 {
		args = append(args, "-skip="+anchored(skip))
	}
	args = append(args, ".")
	fmt.Printf("\n(cd %s && go %s)\n", dir, strings.Join(args, " "))
	start := time.Now()

	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = goEnv(true)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return false, err
	}
	if err := cmd.Start(); err != nil {
		return false, err
	}
	var rs results
	var w io.Writer
	if verbose {
		w = os.Stdout
	}
	progress := func(name string, res *result) {
		fmt.Printf("  %-4s %s (%.2fs)\n", strings.ToUpper(res.action), name, res.elapsed)
	}
	readErr := rs.read(stdout, progress, w)
	waitErr := cmd.Wait()
	if readErr != nil {
		return false, readErr
	}
	fmt.Printf("go test took %s\n", time.Since(start).Round(time.Second))

	verdicts := rs.judge(run)
	failed := 0
	for _, v := range verdicts {
		if !v.ok {
			failed++
		}
	}
	if failed > 0 && !verbose {
		// What the tests printed outside any test: build errors, or the
		// panic or timeout that ended the binary.
		if other := rs.otherOutput(); len(other) > 0 || stderr.Len() > 0 {
			fmt.Printf("\noutput outside the tests:\n")
			for _, l := range other {
				fmt.Printf("  %s\n", l)
			}
		}
		if stderr.Len() > 0 {
			fmt.Printf("%s", &stderr)
		}
	}

	fmt.Printf("\nresults:\n")
	for _, v := range verdicts {
		fmt.Printf("  %-9s %s\n", v.status, v.name)
		for _, r := range v.reasons {
			fmt.Printf("            %s\n", r)
		}
	}
	for _, name := range skip {
		fmt.Printf("  %-9s %s: %s\n", "SKIPPED", name, skipped[name])
	}
	fmt.Printf("\n%d named tests: %d run, %d passed, %d did not pass, %d skipped as they need the network\n",
		len(run)+len(skip), len(run), len(run)-failed, failed, len(skip))

	var exit *exec.ExitError
	switch {
	case failed > 0:
		return false, nil
	case errors.As(waitErr, &exit):
		// Every named test passed, yet go test failed: something outside
		// them did, and it is not known to be harmless.
		fmt.Printf("go test failed although every named test passed: %v\n%s", waitErr, &stderr)
		return false, nil
	case waitErr != nil:
		return false, waitErr
	}
	fmt.Println("ok")
	return true, nil
}

// otherOutput returns the output that go test -json did not tie to a test,
// without the package's closing lines (FAIL, ok) that say nothing new.
func (rs *results) otherOutput() []string {
	var out []string
	for _, l := range rs.other {
		if strings.HasPrefix(l, "FAIL") || strings.HasPrefix(l, "ok ") || l == "PASS" {
			continue
		}
		out = append(out, l)
	}
	return out
}

// anchored returns a -run or -skip pattern that matches the top-level tests
// names and nothing else: no test whose name only begins with one of them.
func anchored(names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	return "^(" + strings.Join(quoted, "|") + ")$"
}

// goEnv is the environment of the go commands run here. A go.work above the
// repository or the temporary directory must not take them over. mod adds
// -mod=mod, which lets go test add to the copied tests' go.mod the modules
// only CoreDNS's tests import.
func goEnv(mod bool) []string {
	env := append(os.Environ(), "GOWORK=off")
	if mod {
		env = append(env, "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"))
	}
	return env
}

// goCmd runs go with args in dir ("" for the current directory) and returns
// its standard output.
func goCmd(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = goEnv(false)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, &stderr)
	}
	return string(out), nil
}
