package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// directive matches cache as the directive of a Corefile line: the first word
// on its line, followed by its arguments, its block or the end of the line.
// Words that only contain it (cache.example.org, plugin/cache, no-cache) do
// not match.
var directive = regexp.MustCompile(`(?m)^([ \t]*)cache([ \t{]|$)`)

// switchDirective writes compactcache where a Corefile in the Go source src
// says cache. Corefiles are the string literals that hold a line break: the
// tests write them as multi-line raw strings, or build one from fragments
// such as acl_test.go's "\n\tcache 30". Comments, identifiers and imports are
// not strings of that kind, so a Go variable named cache, a comment about the
// cache or the import of plugin/cache stay as they are.
//
// It returns the new source, the number of directives switched, and the
// top-level functions they were in ("" for one outside any function).
func switchDirective(name string, src []byte) (out []byte, n int, funcs []string, err error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, 0, nil, err
	}
	type edit struct {
		start, end int
		text       string
	}
	var edits []edit
	for _, decl := range f.Decls {
		fn := ""
		if d, ok := decl.(*ast.FuncDecl); ok {
			fn = d.Name.Name
		}
		ast.Inspect(decl, func(node ast.Node) bool {
			switch node := node.(type) {
			case *ast.ImportSpec:
				return false
			case *ast.BasicLit:
				if node.Kind != token.STRING || err != nil {
					return false
				}
				text, k, lerr := switchLiteral(node.Value)
				if lerr != nil {
					err = fmt.Errorf("%s: %v", fset.Position(node.Pos()), lerr)
					return false
				}
				if k > 0 {
					n += k
					for range k {
						funcs = append(funcs, fn)
					}
					edits = append(edits, edit{fset.Position(node.Pos()).Offset, fset.Position(node.End()).Offset, text})
				}
			}
			return true
		})
	}
	if err != nil {
		return nil, 0, nil, err
	}
	out = slices.Clone(src)
	// From the end, so that the offsets of the edits still to make hold.
	for _, e := range slices.Backward(edits) {
		out = slices.Concat(out[:e.start], []byte(e.text), out[e.end:])
	}
	return out, n, funcs, nil
}

// switchLiteral switches the directive in one Go string literal, raw or
// interpreted, and returns the literal to write in its place.
func switchLiteral(lit string) (string, int, error) {
	s, err := strconv.Unquote(lit)
	if err != nil {
		return "", 0, err
	}
	if !strings.Contains(s, "\n") {
		return lit, 0, nil
	}
	n := len(directive.FindAllStringIndex(s, -1))
	if n == 0 {
		return lit, 0, nil
	}
	s = directive.ReplaceAllString(s, "${1}compactcache${2}")
	if lit[0] == '`' {
		// The directive holds no backquote, so the raw string stays one.
		return "`" + s + "`", n, nil
	}
	return strconv.Quote(s), n, nil
}

// registration is the one file added to the copied tests. It does what
// cmd/coredns does for the real build: link compactcache in and place its
// directive just before cache, since the order of dnsserver.Directives is the
// order of the plugin chain and a directive missing from it is rejected when
// a Corefile is parsed. caddy reads the list when a test starts a server,
// after every init.
const registration = `// Added by compactcache's internal/corednstests: compactcache in the
// directive list where cache stands, as its cmd/coredns has it.

package %s

import (
	"slices"

	_ "github.com/compactcache/compactcache" // Registers the compactcache plugin.
	"github.com/coredns/coredns/core/dnsserver"
)

func init() {
	i := slices.Index(dnsserver.Directives, "cache")
	if i < 0 {
		panic(` + "`" + `directive "cache" not found in dnsserver.Directives` + "`" + `)
	}
	if err := dnsserver.SetDirectives(slices.Insert(slices.Clone(dnsserver.Directives), i, "compactcache")); err != nil {
		panic(err)
	}
}
`

// registrationFile returns the registration for the package pkg.
func registrationFile(pkg string) []byte { return fmt.Appendf(nil, registration, pkg) }
