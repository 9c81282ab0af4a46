package hostsource

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 1, 0, time.UTC)

// fixture copies testdata/host (a GPU host's /proc and /sys: two whole disks beside a
// partition, device-mapper, md and loop devices; two NICs beside lo, a bridge and a veth)
// into a directory the test may rewrite.
func fixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/host")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func open(t *testing.T, root string) (*Source, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := New(Options{ProcRoot: filepath.Join(root, "proc"), SysRoot: filepath.Join(root, "sys")}, reg,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

// disks are the fixture's /proc/diskstats counters: sectors read and written.
var disks = map[string][2]uint64{
	"loop0": {8000, 0}, "sda": {4000000, 2000000}, "sda1": {3900000, 1900000},
	"nvme0n1": {180000000, 80000000}, "nvme0n1p1": {179000000, 79000000},
	"dm-0": {178000000, 78000000}, "md0": {8000, 8000},
}

// links are the fixture's /proc/net/dev counters: bytes received and sent.
var links = map[string][2]uint64{
	"lo": {9e9, 9e9}, "eth0": {5e11, 2e11}, "ib0": {7e12, 6e12}, "docker0": {3e7, 4e7}, "veth1a2b": {4e7, 3e7},
}

// writeDisks rewrites /proc/diskstats under root in the kernel's format.
func writeDisks(t *testing.T, root string, c map[string][2]uint64) {
	t.Helper()
	var b strings.Builder
	for i, name := range slices.Sorted(maps.Keys(c)) {
		v := c[name]
		fmt.Fprintf(&b, "%4d %7d %s 1000 0 %d 100 2000 0 %d 200 0 300 300 0 0 0 0\n", 8, i, name, v[0], v[1])
	}
	write(t, filepath.Join(root, "proc", "diskstats"), b.String())
}

// writeLinks rewrites /proc/net/dev under root in the kernel's format.
func writeLinks(t *testing.T, root string, c map[string][2]uint64) {
	t.Helper()
	b := strings.Builder{}
	b.WriteString("Inter-|   Receive                                                |  Transmit\n")
	b.WriteString(" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n")
	for _, name := range slices.Sorted(maps.Keys(c)) {
		v := c[name]
		fmt.Fprintf(&b, "%6s: %d 10 0 0 0 0 0 0 %d 10 0 0 0 0 0 0\n", name, v[0], v[1])
	}
	write(t, filepath.Join(root, "proc", "net", "dev"), b.String())
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func add(base map[string][2]uint64, d map[string][2]uint64) map[string][2]uint64 {
	out := map[string][2]uint64{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range d {
		out[k] = [2]uint64{out[k][0] + v[0], out[k][1] + v[1]}
	}
	return out
}

func val[T any](t *testing.T, name string, p *T) T {
	t.Helper()
	if p == nil {
		t.Fatalf("%s absent", name)
	}
	return *p
}

// TestReadFixture reads the fixture twice, a second apart: memory at once, rates from the
// second tick, counting only whole disks and devices' interfaces.
func TestReadFixture(t *testing.T) {
	root := fixture(t)
	s, _ := open(t, root)
	first := s.Read(t0)
	const kb = 1024
	if got, want := val(t, "mem_total_bytes", first.MemTotalBytes), uint64(2113451096*kb); got != want {
		t.Fatalf("mem_total_bytes %d, want %d", got, want)
	}
	if got, want := val(t, "mem_available_bytes", first.MemAvailableBytes), uint64(1710798024*kb); got != want {
		t.Fatalf("mem_available_bytes %d, want %d", got, want)
	}
	if got, want := val(t, "mem_used_bytes", first.MemUsedBytes), uint64((2113451096-1710798024)*kb); got != want {
		t.Fatalf("mem_used_bytes %d, want %d", got, want)
	}
	if first.DiskReadBps != nil || first.NetRxBps != nil || first.DeltaSeconds != nil {
		t.Fatalf("first tick has rates: %+v", first)
	}

	// Every device moves; only sda, nvme0n1, eth0 and ib0 count.
	writeDisks(t, root, add(disks, map[string][2]uint64{
		"sda": {2048, 1024}, "sda1": {2048, 1024}, "nvme0n1": {4096, 0}, "nvme0n1p1": {4096, 0},
		"dm-0": {4096, 0}, "loop0": {100, 100}, "md0": {50, 50}}))
	writeLinks(t, root, add(links, map[string][2]uint64{
		"lo": {1e9, 1e9}, "eth0": {1e6, 5e5}, "ib0": {2e9, 1e9}, "docker0": {1e8, 1e8}, "veth1a2b": {1e8, 1e8}}))
	second := s.Read(t0.Add(2 * time.Second)) // a skipped tick: the rates cover two seconds
	second.V, second.TS, second.Host = events.Version, t0.Add(2*time.Second), "gpu-node-3"
	if err := second.ValidateAt(t0.Add(3 * time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		got  *float64
		want float64
	}{
		{"delta_seconds", second.DeltaSeconds, 2},
		{"disk_read_bps", second.DiskReadBps, (2048 + 4096) * 512 / 2},
		{"disk_write_bps", second.DiskWriteBps, 1024 * 512 / 2},
		{"net_rx_bps", second.NetRxBps, (1e6 + 2e9) / 2},
		{"net_tx_bps", second.NetTxBps, (5e5 + 1e9) / 2},
	} {
		if got := val(t, c.name, c.got); got != c.want {
			t.Errorf("%s = %g, want %g", c.name, got, c.want)
		}
	}
}

// TestCounterReset: a disk whose counters fell (it was removed and came back) counts from
// zero, an interface whose counters fell likewise, and the reset is counted; a device seen
// for the first time adds nothing.
func TestCounterReset(t *testing.T) {
	root := fixture(t)
	s, _ := open(t, root)
	s.Read(t0)
	d := add(disks, map[string][2]uint64{"nvme0n1": {10, 10}})
	d["sda"] = [2]uint64{300, 100}
	writeDisks(t, root, d)
	l := add(links, map[string][2]uint64{"ib0": {1000, 1000}})
	l["eth0"] = [2]uint64{64, 32}
	writeLinks(t, root, l)
	// A third disk appears with years of counts behind it.
	if err := os.MkdirAll(filepath.Join(root, "sys", "block", "sdb", "device"), 0o755); err != nil {
		t.Fatal(err)
	}
	d["sdb"] = [2]uint64{9e12, 9e12}
	writeDisks(t, root, d)
	smp := s.Read(t0.Add(time.Second))
	if got := val(t, "disk_read_bps", smp.DiskReadBps); got != (300+10)*512 {
		t.Fatalf("disk_read_bps %g, want %d", got, (300+10)*512)
	}
	if got := val(t, "disk_write_bps", smp.DiskWriteBps); got != (100+10)*512 {
		t.Fatalf("disk_write_bps %g, want %d", got, (100+10)*512)
	}
	if got := val(t, "net_rx_bps", smp.NetRxBps); got != 1000+64 {
		t.Fatalf("net_rx_bps %g, want 1064", got)
	}
	for _, r := range []string{readingDisk, readingNetwork} {
		if got := testutil.ToFloat64(s.m.resets.WithLabelValues(r)); got != 1 {
			t.Fatalf("%s resets %g, want 1", r, got)
		}
	}
	// The next tick counts sdb from its first read.
	d["sdb"] = [2]uint64{9e12 + 8, 9e12}
	writeDisks(t, root, d)
	if got := val(t, "disk_read_bps", s.Read(t0.Add(2*time.Second)).DiskReadBps); got != 8*512 {
		t.Fatalf("disk_read_bps %g, want %d", got, 8*512)
	}
}

func TestDelta(t *testing.T) {
	f := func(prev, cur uint64, width int, want uint64, wantReset bool) {
		t.Helper()
		got, reset := delta(prev, cur, width)
		if got != want || reset != wantReset {
			t.Fatalf("delta(%d, %d, %d) = %d, %v; want %d, %v", prev, cur, width, got, reset, want, wantReset)
		}
	}
	f(10, 25, 64, 15, false)
	f(10, 10, 32, 0, false)
	f(1<<32-100, 200, 32, 300, true) // a 32-bit counter wrapped
	f(1000, 500, 32, 500, true)      // restarted: 2^32 − 500 past a wrap is no wrap
	f(1<<40, 7, 32, 7, true)         // above 32 bits: cannot have wrapped at 32
	f(1<<63, 5, 64, 5, true)         // 64 bits never wrap in practice: a restart
}

// TestUnreadable: a file that cannot be read, or that procfs cannot parse (a truncated
// line once made it panic), leaves its readings out and is counted; the others stay, and
// the reading comes back with rates once it has a previous good read.
func TestUnreadable(t *testing.T) {
	root := fixture(t)
	s, _ := open(t, root)
	s.Read(t0)
	diskstats := filepath.Join(root, "proc", "diskstats")
	if err := os.Remove(diskstats); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(root, "proc", "meminfo"), "MemTotal:\nMemAvailable: 1 kB\n") // a line procfs indexes past
	write(t, filepath.Join(root, "proc", "net", "dev"), "h1\nh2\n  eth0: 1 2 3\n")      // too few fields
	smp := s.Read(t0.Add(time.Second))
	if smp.DiskReadBps != nil || smp.MemTotalBytes != nil || smp.NetRxBps != nil || smp.DeltaSeconds != nil {
		t.Fatalf("unreadable readings present: %+v", smp)
	}
	for _, r := range []string{readingMemory, readingDisk, readingNetwork} {
		if got := testutil.ToFloat64(s.m.errors.WithLabelValues(r)); got != 1 {
			t.Fatalf("%s errors %g, want 1", r, got)
		}
	}
	// Back: the first good read has nothing to subtract, the next has rates.
	writeDisks(t, root, disks)
	writeLinks(t, root, links)
	write(t, filepath.Join(root, "proc", "meminfo"), "MemTotal: 100 kB\nMemAvailable: 40 kB\n")
	smp = s.Read(t0.Add(2 * time.Second))
	if smp.DiskReadBps != nil || smp.NetRxBps != nil || val(t, "mem_used_bytes", smp.MemUsedBytes) != 60*1024 {
		t.Fatalf("after the gap: %+v", smp)
	}
	writeDisks(t, root, add(disks, map[string][2]uint64{"sda": {2, 0}}))
	smp = s.Read(t0.Add(3 * time.Second))
	if val(t, "disk_read_bps", smp.DiskReadBps) != 1024 || val(t, "net_rx_bps", smp.NetRxBps) != 0 {
		t.Fatalf("after the gap: %+v", smp)
	}
	// A kernel without MemAvailable (before 3.14): total only.
	write(t, filepath.Join(root, "proc", "meminfo"), "MemTotal: 100 kB\nMemFree: 40 kB\n")
	if smp := s.Read(t0.Add(4 * time.Second)); smp.MemTotalBytes == nil || smp.MemUsedBytes != nil || smp.MemAvailableBytes != nil {
		t.Fatalf("without MemAvailable: %+v", smp)
	}
}

// TestContainerNetwork: in a network namespace whose interfaces have no device (eth0 a
// veth), every interface but lo counts.
func TestContainerNetwork(t *testing.T) {
	root := fixture(t)
	for _, i := range []string{"eth0", "ib0"} {
		if err := os.RemoveAll(filepath.Join(root, "sys", "class", "net", i, "device")); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := open(t, root)
	s.Read(t0)
	writeLinks(t, root, add(links, map[string][2]uint64{"lo": {5, 5}, "eth0": {1, 0}, "ib0": {10, 0}, "docker0": {100, 0}, "veth1a2b": {1000, 0}}))
	if got := val(t, "net_rx_bps", s.Read(t0.Add(time.Second)).NetRxBps); got != 1111 {
		t.Fatalf("net_rx_bps %g, want 1111", got)
	}
}

func TestNewFailsWithoutProc(t *testing.T) {
	_, err := New(Options{ProcRoot: filepath.Join(t.TempDir(), "missing")}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "cannot open the proc root") {
		t.Fatalf("err = %v", err)
	}
}

// writeHostAndContainerLinks returns what writes the fixture's interfaces at root as a
// container that has a network namespace of its own sees them: host's as PID 1's
// (proc/1/net/dev), container's as its own (proc/net/dev).
func writeHostAndContainerLinks(t *testing.T, root string) func(host, container map[string][2]uint64) {
	t.Helper()
	init := filepath.Join(root, "proc", "1", "net")
	if err := os.MkdirAll(init, 0o755); err != nil {
		t.Fatal(err)
	}
	return func(host, container map[string][2]uint64) {
		writeLinks(t, root, host)
		if err := os.Rename(filepath.Join(root, "proc", "net", "dev"), filepath.Join(init, "dev")); err != nil {
			t.Fatal(err)
		}
		writeLinks(t, root, container)
	}
}

// TestHostProcInContainer: the host's /proc mounted in a container that has a network
// namespace of its own (GPUWATCH_PROC_ROOT=/host/proc). There /host/proc/net/dev is the
// reader's namespace, the container's (procfs resolves net through self), whose eth0 is a
// veth that the host's /sys lists under the name of the host's own NIC; the host's are the
// interfaces of its PID 1. The host's are read: the container's traffic alone, passed off
// as the host's, is what the host sample would hold otherwise.
func TestHostProcInContainer(t *testing.T) {
	root := fixture(t)
	self := map[string][2]uint64{"lo": {100, 100}, "eth0": {1000, 2000}}
	both := writeHostAndContainerLinks(t, root)
	both(links, self)
	s, _ := open(t, root)
	s.Read(t0)
	both(add(links, map[string][2]uint64{"eth0": {1e6, 5e5}, "ib0": {2e9, 1e9}}), add(self, map[string][2]uint64{"eth0": {10, 20}}))
	smp := s.Read(t0.Add(time.Second))
	if got := val(t, "net_rx_bps", smp.NetRxBps); got != 1e6+2e9 {
		t.Errorf("net_rx_bps %g, want %g, the host's (the container's: 10)", got, 1e6+2e9)
	}
	if got := val(t, "net_tx_bps", smp.NetTxBps); got != 5e5+1e9 {
		t.Errorf("net_tx_bps %g, want %g", got, 5e5+1e9)
	}
}

// TestHostPIDWithContainerSys: a container that sees the host's PIDs (hostPID, or the
// host's /proc mounted) but has a network namespace and a /sys of its own: PID 1's
// interfaces are the host's, but that /sys lists the container's, so none of the host's
// can be told backed by a device, and reading them all would add every bridge, veth and
// tunnel to the NICs whose traffic they carry. The reader's own interfaces, the ones /sys
// describes, are read, as they were before PID 1's were.
func TestHostPIDWithContainerSys(t *testing.T) {
	root := fixture(t)
	host := map[string][2]uint64{"lo": {100, 100}, "eno1": {5e11, 2e11}, "cni0": {4e10, 3e10}, "veth9f": {4e10, 3e10}, "tunl0": {1e9, 1e9}}
	self := map[string][2]uint64{"lo": {100, 100}, "eth0": {1000, 2000}}
	both := writeHostAndContainerLinks(t, root)
	both(host, self)
	s, _ := open(t, root)
	s.Read(t0)
	both(add(host, map[string][2]uint64{"eno1": {1e6, 1e6}, "cni0": {1e6, 1e6}, "veth9f": {1e6, 1e6}}), add(self, map[string][2]uint64{"eth0": {1e6, 1e6}}))
	smp := s.Read(t0.Add(time.Second))
	if got := val(t, "net_rx_bps", smp.NetRxBps); got != 1e6 {
		t.Errorf("net_rx_bps %g, want %g, the container's eth0 (the host's NIC, bridge and veth summed: 3e6)", got, 1e6)
	}
}

// TestNothingToCompare: a reading whose devices of the previous tick are all gone (a NIC
// driver reloaded, its interfaces back under other names; the disks swapped) has no rate
// that tick, as at the first: there is nothing to subtract, and 0 B/s would be a reading
// never taken. The next tick has rates again.
func TestNothingToCompare(t *testing.T) {
	root := fixture(t)
	s, _ := open(t, root)
	s.Read(t0)
	for _, rename := range [][2]string{{"eth0", "ens5f0"}, {"ib0", "ibp12s0"}} {
		if err := os.Rename(filepath.Join(root, "sys", "class", "net", rename[0]), filepath.Join(root, "sys", "class", "net", rename[1])); err != nil {
			t.Fatal(err)
		}
	}
	l := map[string][2]uint64{"lo": links["lo"], "docker0": links["docker0"], "veth1a2b": links["veth1a2b"],
		"ens5f0": links["eth0"], "ibp12s0": links["ib0"]}
	writeLinks(t, root, l)
	smp := s.Read(t0.Add(time.Second))
	if smp.NetRxBps != nil || smp.NetTxBps != nil {
		t.Fatalf("net rates %v, %v with no interface read at both ticks; want none", *smp.NetRxBps, *smp.NetTxBps)
	}
	if val(t, "disk_read_bps", smp.DiskReadBps) != 0 || val(t, "delta_seconds", smp.DeltaSeconds) != 1 {
		t.Fatalf("the disks' rates lost beside it: %+v", smp)
	}
	writeLinks(t, root, add(l, map[string][2]uint64{"ens5f0": {100, 10}}))
	if got := val(t, "net_rx_bps", s.Read(t0.Add(2*time.Second)).NetRxBps); got != 100 {
		t.Fatalf("net_rx_bps %g at the next tick, want 100", got)
	}
}

// TestDevicesGone: a host whose NICs are gone for a while (their driver unloaded for an
// update) has no network rate then, counted as a failed read: the bridges and veths left,
// whose traffic is the containers' and counted twice, are not the host's network. A
// namespace that never had an interface with a device still reads its own (see
// TestContainerNetwork).
func TestDevicesGone(t *testing.T) {
	root := fixture(t)
	s, _ := open(t, root)
	s.Read(t0)
	gone := map[string][2]uint64{"lo": links["lo"], "docker0": links["docker0"], "veth1a2b": links["veth1a2b"]}
	for _, i := range []string{"eth0", "ib0"} {
		if err := os.RemoveAll(filepath.Join(root, "sys", "class", "net", i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 2; i++ {
		gone = add(gone, map[string][2]uint64{"docker0": {1e6, 1e6}, "veth1a2b": {1e6, 1e6}})
		writeLinks(t, root, gone)
		if smp := s.Read(t0.Add(time.Duration(i) * time.Second)); smp.NetRxBps != nil {
			t.Fatalf("tick %d: net_rx_bps %g with every NIC gone: the bridge's and veth's traffic, not the host's", i, *smp.NetRxBps)
		}
	}
	if got := testutil.ToFloat64(s.m.errors.WithLabelValues(readingNetwork)); got != 2 {
		t.Fatalf("network errors %g, want 2", got)
	}
}
