// Package hostsource reads the host gpuwatch runs on through procfs
// (github.com/prometheus/procfs): memory, and the disk and network counters turned into
// bytes per second between ticks.
package hostsource
