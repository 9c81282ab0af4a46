package replay

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Source plays a recording.
type Source struct {
	start  time.Time // when playback began
	first  time.Time // the recording's first timestamp
	period time.Duration
	gpus   []*track
}

// track is one GPU's recorded samples, in time order.
type track struct {
	samples []events.GPUSample
	offsets []time.Duration // from first
	energy  float64         // used over one loop: last counter minus first
}

// Open reads the recording at path; playback starts at start.
func Open(path string, start time.Time) (*Source, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open the replay file: %w", err)
	}
	defer f.Close()
	s, err := Read(f, start)
	if err != nil {
		return nil, fmt.Errorf("cannot replay %s: %w", path, err)
	}
	return s, nil
}

// Read reads a recording from r; playback starts at start.
func Read(r io.Reader, start time.Time) (*Source, error) {
	byUUID := map[string]*track{}
	var order []*track
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 || b[0] == '#' {
			continue
		}
		var smp events.GPUSample
		if err := events.UnmarshalGPUSample(b, &smp); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		// Check the recording against the contract as of its own time: it is old.
		if err := smp.ValidateAt(smp.TS); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		tr := byUUID[smp.GPUUUID]
		if tr == nil {
			tr = &track{}
			byUUID[smp.GPUUUID] = tr
			order = append(order, tr)
		}
		tr.samples = append(tr.samples, smp)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("no samples in %d lines", line)
	}
	s := &Source{start: start, gpus: order}
	var last time.Time
	step := time.Duration(0)
	for i, tr := range order {
		slices.SortStableFunc(tr.samples, func(a, b events.GPUSample) int { return a.TS.Compare(b.TS) })
		if i == 0 || tr.samples[0].TS.Before(s.first) {
			s.first = tr.samples[0].TS
		}
		if end := tr.samples[len(tr.samples)-1].TS; end.After(last) {
			last = end
		}
		for j := 1; j < len(tr.samples); j++ {
			if gap := tr.samples[j].TS.Sub(tr.samples[j-1].TS); gap > 0 && (step == 0 || gap < step) {
				step = gap
			}
		}
	}
	if step == 0 {
		step = time.Second
	}
	// One loop is the recording plus one step, so its last sample plays as long as the others.
	s.period = last.Sub(s.first) + step
	for _, tr := range order {
		tr.offsets = make([]time.Duration, len(tr.samples))
		var firstE, lastE *float64
		for j, smp := range tr.samples {
			tr.offsets[j] = smp.TS.Sub(s.first)
			if smp.EnergyJ != nil {
				if firstE == nil {
					firstE = smp.EnergyJ
				}
				lastE = smp.EnergyJ
			}
		}
		if firstE != nil && *lastE > *firstE {
			tr.energy = *lastE - *firstE
		}
	}
	return s, nil
}

// Period returns how long one loop of the recording lasts.
func (s *Source) Period() time.Duration { return s.period }

// Sample appends, for each recorded GPU, the recorded sample that was current at the same
// point of the loop as now. A GPU whose recording starts later in the loop is left out
// until its first sample.
func (s *Source) Sample(_ context.Context, now time.Time, dst []events.GPUSample) []events.GPUSample {
	elapsed := max(now.Sub(s.start), 0)
	loop := elapsed / s.period
	off := elapsed - loop*s.period
	for _, tr := range s.gpus {
		i, found := slices.BinarySearch(tr.offsets, off)
		if !found {
			i-- // the last sample before off
		} else {
			for i+1 < len(tr.offsets) && tr.offsets[i+1] == off {
				i++
			}
		}
		if i < 0 {
			continue
		}
		smp := tr.samples[i]
		smp.Source = events.SourceReplay
		if smp.EnergyJ != nil && loop > 0 {
			e := *smp.EnergyJ + float64(loop)*tr.energy
			smp.EnergyJ = &e
		}
		dst = append(dst, smp)
	}
	return dst
}
