package hostsource

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
	"github.com/prometheus/procfs/blockdevice"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Options say where the kernel's files are: a host's /proc and /sys, or a copy of them
// mounted elsewhere (a container) or written by a test.
type Options struct {
	ProcRoot string // default /proc
	SysRoot  string // default /sys
}

// Readings, as metric label values.
const (
	readingMemory  = "memory"
	readingDisk    = "disk"
	readingNetwork = "network"
)

// maxBps bounds a believable rate; a larger one comes from a counter that jumped.
const maxBps = 1e15

// Source reads the host once per tick. It is not safe for concurrent use: the tick calls it.
type Source struct {
	proc   procfs.FS
	netDev func() (procfs.NetDev, error) // the host's interfaces: those of PID 1's network namespace
	block  blockdevice.FS
	sys    string
	m      *metrics
	logger *slog.Logger

	disk  counters // sectors read and written, per whole disk
	net   counters // bytes received and sent, per interface
	nics  bool     // an interface backed by a device has been read: the others are never the host's network
	fails [3]string
}

// counters is what the previous good read of one kind of counter left, to subtract.
type counters struct {
	at   time.Time // zero: no previous read
	prev map[string][2]uint64
	cur  map[string][2]uint64 // scratch, swapped with prev
}

// New opens the proc and sys roots. It fails when either cannot be read at all; a file
// that cannot be read later leaves its readings out of that tick's sample.
func New(opts Options, reg prometheus.Registerer, logger *slog.Logger) (*Source, error) {
	if opts.ProcRoot == "" {
		opts.ProcRoot = procfs.DefaultMountPoint
	}
	if opts.SysRoot == "" {
		opts.SysRoot = "/sys"
	}
	proc, err := procfs.NewFS(opts.ProcRoot)
	if err != nil {
		return nil, fmt.Errorf("cannot open the proc root %s: %w", opts.ProcRoot, err)
	}
	block, err := blockdevice.NewFS(opts.ProcRoot, opts.SysRoot)
	if err != nil {
		return nil, fmt.Errorf("cannot open the sys root %s: %w", opts.SysRoot, err)
	}
	s := &Source{proc: proc, block: block, sys: opts.SysRoot, m: newMetrics(reg), logger: logger,
		disk: newCounters(), net: newCounters()}
	s.netDev = s.initNetDev()
	return s, nil
}

// initNetDev returns the reader of the interfaces of PID 1's network namespace, the host's,
// or of the reader's own where PID 1's cannot be read (procfs mounted with hidepid) or the
// sys root describes none of them. The proc root's net/dev is the reader's namespace
// whatever the root (procfs resolves net through self): in a container of its own network
// namespace with the host's /proc mounted, its own interfaces, a veth whose name the host's
// /sys may give to the host's NIC. A /sys mounted in that namespace (the container's own,
// beside hostPID) lists the container's interfaces, not PID 1's: none of the host's would
// be found backed by a device, and reading them all would count every bridge and veth
// beside the NICs; the container's own, which that /sys describes, are read then.
func (s *Source) initNetDev() func() (procfs.NetDev, error) {
	if p, err := s.proc.Proc(1); err == nil {
		if dev, err := guarded(p.NetDev); err == nil {
			for name := range dev {
				if name != "lo" && s.hasDevice("class/net", name) {
					return p.NetDev
				}
			}
		}
	}
	return s.proc.NetDev
}

func newCounters() counters {
	return counters{prev: map[string][2]uint64{}, cur: map[string][2]uint64{}}
}

// Read returns the host's readings at now, the tick; version, time and host are the
// caller's to set. A reading that cannot be read is nil; so are the rates of the first
// tick, of the first tick after one whose read failed, and of a tick that has none of the
// previous tick's devices.
func (s *Source) Read(now time.Time) events.HostSample {
	var smp events.HostSample
	s.readMemory(&smp)
	var dt float64
	if r, w, d, ok := s.readDisk(now); ok {
		smp.DiskReadBps, smp.DiskWriteBps, dt = &r, &w, d
	}
	if rx, tx, d, ok := s.readNet(now); ok {
		smp.NetRxBps, smp.NetTxBps, dt = &rx, &tx, d
	}
	if dt > 0 {
		smp.DeltaSeconds = &dt
	}
	return smp
}

func (s *Source) readMemory(smp *events.HostSample) {
	mi, err := guarded(s.proc.Meminfo)
	if err == nil && mi.MemTotalBytes == nil {
		err = errors.New("no MemTotal in meminfo")
	}
	if err != nil {
		s.fail(0, readingMemory, err)
		return
	}
	s.ok(0, readingMemory)
	total := *mi.MemTotalBytes
	smp.MemTotalBytes = &total
	// MemAvailable is the kernel's own estimate (since 3.14); without it there is no
	// honest "used", so both stay out.
	if a := mi.MemAvailableBytes; a != nil && *a <= total {
		avail, used := *a, total-*a
		smp.MemAvailableBytes, smp.MemUsedBytes = &avail, &used
	}
}

// readDisk returns the bytes per second read and written by the whole disks since the
// previous tick. A whole disk is a /sys/block entry backed by a device: partitions are not
// listed there, and device-mapper, md, loop and zram devices, whose I/O the disks under
// them also count, have no device.
func (s *Source) readDisk(now time.Time) (r, w, dt float64, ok bool) {
	names, err := s.block.SysBlockDevices()
	if err != nil {
		s.fail(1, readingDisk, fmt.Errorf("cannot list block devices: %w", err))
		s.disk.at = time.Time{}
		return 0, 0, 0, false
	}
	whole := map[string]bool{}
	for _, n := range names {
		if s.hasDevice("block", n) {
			whole[n] = true
		}
	}
	stats, err := guarded(s.block.ProcDiskstats)
	if err == nil && len(whole) == 0 {
		err = errors.New("no whole disk in " + filepath.Join(s.sys, "block"))
	}
	if err != nil {
		s.fail(1, readingDisk, err)
		s.disk.at = time.Time{}
		return 0, 0, 0, false
	}
	s.ok(1, readingDisk)
	clear(s.disk.cur)
	for _, d := range stats {
		if whole[d.DeviceName] {
			s.disk.cur[d.DeviceName] = [2]uint64{d.ReadSectors, d.WriteSectors}
		}
	}
	// Sector counts are the kernel's unsigned long: they wrap at the word size.
	rs, ws, dt, ok := s.disk.advance(now, bits.UintSize, s.m.resets.WithLabelValues(readingDisk))
	if !ok {
		return 0, 0, 0, false
	}
	return s.rates(readingDisk, rs*procfs.SectorSize, ws*procfs.SectorSize, dt)
}

// readNet returns the bytes per second received and sent since the previous tick on the
// interfaces backed by a device; where none ever was (a container's network namespace,
// whose eth0 is a veth), on every interface but lo. Bridges, veths and tunnels are left out
// otherwise, for the traffic they carry crosses a device too and would count twice: on a
// host whose NICs are gone for a while (their driver reloaded) they are not its network.
func (s *Source) readNet(now time.Time) (rx, tx, dt float64, ok bool) {
	dev, err := guarded(s.netDev)
	if err != nil {
		s.fail(2, readingNetwork, err)
		s.net.at = time.Time{}
		return 0, 0, 0, false
	}
	clear(s.net.cur)
	for name, l := range dev {
		if name != "lo" && s.hasDevice("class/net", name) {
			s.net.cur[name] = [2]uint64{l.RxBytes, l.TxBytes}
		}
	}
	switch {
	case len(s.net.cur) > 0:
		s.nics = true
	case !s.nics:
		for name, l := range dev {
			if name != "lo" {
				s.net.cur[name] = [2]uint64{l.RxBytes, l.TxBytes}
			}
		}
	}
	if len(s.net.cur) == 0 {
		err := errors.New("no network interface but lo")
		if s.nics {
			err = errors.New("no network interface backed by a device any more")
		}
		s.fail(2, readingNetwork, err)
		s.net.at = time.Time{}
		return 0, 0, 0, false
	}
	s.ok(2, readingNetwork)
	// /proc/net/dev prints the kernel's 64-bit link statistics on every architecture.
	rb, tb, dt, ok := s.net.advance(now, 64, s.m.resets.WithLabelValues(readingNetwork))
	if !ok {
		return 0, 0, 0, false
	}
	return s.rates(readingNetwork, rb, tb, dt)
}

// rates turns two byte counts over dt seconds into rates; a rate no host reaches comes
// from a counter that jumped, and is left out and counted as a reset.
func (s *Source) rates(reading string, a, b, dt float64) (ra, rb, _ float64, ok bool) {
	ra, rb = a/dt, b/dt
	if ra > maxBps || rb > maxBps {
		s.m.resets.WithLabelValues(reading).Inc()
		return 0, 0, 0, false
	}
	return ra, rb, dt, true
}

// hasDevice says whether /sys/<class>/<name>/device exists: the entry is backed by
// hardware (or a paravirtual device), not made up by the kernel.
func (s *Source) hasDevice(class, name string) bool {
	_, err := os.Stat(filepath.Join(s.sys, class, name, "device"))
	return err == nil
}

// advance sums, over the entries in both c.cur and c.prev, how far each pair of counters
// moved, makes c.cur the previous read and returns the sums and the seconds since the
// previous read (ok false when there was none, or when no entry is in both: every device
// of the previous read is gone, and 0 would be a rate never measured). An entry seen for
// the first time (a disk plugged in, an interface created) adds nothing: its counts are
// not this tick's.
func (c *counters) advance(now time.Time, width int, resets prometheus.Counter) (a, b, dt float64, ok bool) {
	if !c.at.IsZero() && now.After(c.at) {
		dt = now.Sub(c.at).Seconds()
		for name, cur := range c.cur {
			prev, seen := c.prev[name]
			if !seen {
				continue
			}
			ok = true
			da, wa := delta(prev[0], cur[0], width)
			db, wb := delta(prev[1], cur[1], width)
			if wa || wb {
				resets.Inc()
			}
			a += float64(da)
			b += float64(db)
		}
	}
	c.prev, c.cur = c.cur, c.prev
	c.at = now
	return a, b, dt, ok
}

// delta is how far a counter of width bits moved from prev to cur. A counter below its
// previous value either wrapped or restarted (a device removed and added again under the
// same name); reset reports both. A wrap of a counter narrower than 64 bits is told from a
// restart by the distance: less than half the range past the wrap is a wrap. A restarted
// counter counts from zero, so the delta is its new value.
func delta(prev, cur uint64, width int) (d uint64, reset bool) {
	if cur >= prev {
		return cur - prev, false
	}
	if width < 64 && prev < 1<<width {
		if wrapped := cur + (1 << width) - prev; wrapped < 1<<(width-1) {
			return wrapped, true
		}
	}
	return cur, true
}

// guarded calls a procfs reader, turning a panic into an error: procfs indexes the fields
// of a line without checking how many there are, and a truncated line (a damaged copy under
// a configured root) must cost the reading, not gpuwatch.
func guarded[T any](read func() (T, error)) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot parse: %v", r)
		}
	}()
	return read()
}

// fail counts a failed read and logs it when the failure changes.
func (s *Source) fail(i int, reading string, err error) {
	s.m.errors.WithLabelValues(reading).Inc()
	if msg := err.Error(); msg != s.fails[i] {
		s.logger.Warn("cannot read the host; leaving the reading out of host samples until it answers",
			"reading", reading, "err", err)
		s.fails[i] = msg
	}
}

func (s *Source) ok(i int, reading string) {
	if s.fails[i] != "" {
		s.logger.Info("host reading answers again", "reading", reading)
		s.fails[i] = ""
	}
}

type metrics struct {
	errors *prometheus.CounterVec
	resets *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "host_reading_errors_total",
			Help: "Host readings that could not be read (memory, disk, network) and were left out of the sample."},
			[]string{"reading"}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "host_counter_resets_total",
			Help: "Disk or network counters found below their previous value: wrapped, or restarted by a device that came back."},
			[]string{"reading"}),
	}
	for _, r := range []string{readingMemory, readingDisk, readingNetwork} {
		m.errors.WithLabelValues(r)
		if r != readingMemory {
			m.resets.WithLabelValues(r)
		}
	}
	if reg != nil {
		reg.MustRegister(m.errors, m.resets)
	}
	return m
}
