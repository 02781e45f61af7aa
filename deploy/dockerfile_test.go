package deploy

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDockerfile checks the Dockerfile's shape without a Docker daemon (none
// runs here): a static build, the capability set after the owner, a scratch
// image with the upstream image's entrypoint and ports, run as 65532, and the
// image as the default target. The same shape is what deploy/ociimage writes
// and its tests check on the layout.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// Join continuation lines and drop comments, as the parser does.
	text := regexp.MustCompile(`\\\n`).ReplaceAllString(string(data), " ")
	var lines []string
	for l := range strings.SplitSeq(text, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	type stage struct {
		from, name string
		lines      []string
	}
	var stages []stage
	for _, l := range lines {
		f := strings.Fields(l)
		if strings.EqualFold(f[0], "FROM") {
			s := stage{}
			for i := 1; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					s.name = f[i+1]
					i++
				default:
					s.from = f[i]
				}
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, l)
		}
	}
	find := func(name string) *stage {
		for i := range stages {
			if stages[i].name == name {
				return &stages[i]
			}
		}
		t.Fatalf("no stage %q", name)
		return nil
	}
	build := find("build")
	image := find("image")
	find("capcheck")

	if !strings.HasPrefix(build.from, "golang:") {
		t.Errorf("build stage from %q, want a golang image", build.from)
	}
	run := strings.Join(build.lines, "\n")
	for _, want := range []string{"GOWORK=off", "CGO_ENABLED=0", "cd cmd/coredns", "libcap2-bin"} {
		if !strings.Contains(run, want) {
			t.Errorf("build stage lacks %q", want)
		}
	}
	// chown clears file capabilities, so setcap comes after it.
	chown, setcap := strings.Index(run, "chown 65532:65532 /out/coredns"), strings.Index(run, "setcap cap_net_bind_service=+ep /out/coredns")
	if chown < 0 || setcap < 0 || setcap < chown {
		t.Errorf("want chown 65532:65532 then setcap cap_net_bind_service=+ep on /out/coredns in the build stage")
	}

	if image.from != "scratch" {
		t.Errorf("image stage from %q, want scratch", image.from)
	}
	var user, entry string
	var ports []string
	for _, l := range image.lines {
		f := strings.Fields(l)
		switch strings.ToUpper(f[0]) {
		case "USER":
			user = f[1]
		case "ENTRYPOINT":
			entry = strings.Join(f[1:], " ")
		case "EXPOSE":
			ports = append(ports, f[1:]...)
		case "COPY":
			if strings.Contains(l, "--chown") || strings.Contains(l, "--chmod") {
				t.Errorf("%q: --chown and --chmod drop the file capability; set owner and mode in the build stage", l)
			}
		}
	}
	if !slices.Contains(image.lines, "COPY --from=build /out/compactcache-ctl /compactcache-ctl") {
		t.Errorf("the image lacks /compactcache-ctl, the admin endpoint's tool that kubectl exec runs")
	}
	if user != "65532:65532" {
		t.Errorf("USER %q, want 65532:65532", user)
	}
	if entry != `["/coredns"]` {
		t.Errorf("ENTRYPOINT %s, want [\"/coredns\"]", entry)
	}
	slices.Sort(ports)
	if !slices.Equal(ports, []string{"53/tcp", "53/udp", "9153/tcp"}) {
		t.Errorf("EXPOSE %v, want 53/tcp 53/udp 9153/tcp", ports)
	}
	if last := stages[len(stages)-1]; last.from != "image" {
		t.Errorf("the last stage (the default target) is FROM %q, want FROM image", last.from)
	}
}
