package harness

import (
	"fmt"
	"testing"
	"time"
)

func TestParseCPULoads(t *testing.T) {
	stat := "cpu  200 2 40 10000 6 8 10 14 0 0\n" +
		"cpu0 100 1 20 5000 3 4 5 7 0 0\n" +
		"cpu1 100 1 20 5000 3 4 5 x 0 0\n" +
		"intr 12345 0 0\n"
	loads := ParseCPULoads(stat, 100)
	want := map[string]CPULoad{
		"cpu":  {Busy: 2600 * time.Millisecond, Steal: 140 * time.Millisecond},
		"cpu0": {Busy: 1300 * time.Millisecond, Steal: 70 * time.Millisecond},
	}
	if len(loads) != len(want) {
		t.Fatalf("ParseCPULoads = %v, want %v (cpu1 has a field that is not a number)", loads, want)
	}
	for name, w := range want {
		if loads[name] != w {
			t.Errorf("%s: %+v, want %+v", name, loads[name], w)
		}
	}
	// 64 cores for a year, at 100 ticks a second: past what ticks times
	// time.Second can hold.
	year := int64(64 * 365 * 24 * 3600 * 100)
	if l := ParseCPULoads(fmt.Sprintf("cpu %d 0 0 0 0 0 0 0 0 0\n", year), 100)["cpu"]; l.Busy != 64*365*24*time.Hour {
		t.Errorf("a year of 64 cores: busy %v, want %v", l.Busy, 64*365*24*time.Hour)
	}
	if d := loads["cpu"].Sub(loads["cpu0"]); d != loads["cpu0"] {
		t.Errorf("Sub = %+v, want %+v", d, loads["cpu0"])
	}
}
