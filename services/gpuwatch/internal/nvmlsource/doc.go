// Package nvmlsource reads every GPU of the host through NVML.
//
// A reading the GPU does not support, or that fails, is absent from the sample, never zero,
// and never fails the sample. Support is learned per GPU and reading: a reading NVML calls
// unsupported is skipped until a re-check interval has passed, then tried again. PCIe
// throughput reads block about 20 ms each inside NVML (it samples a 20 ms window), so they
// run on their own goroutine per GPU and the tick takes their latest value; a tick with 8
// GPUs therefore costs microseconds, not a third of a second. The other readings of each
// GPU are read on a goroutine of their own too, one read at a time per GPU, so a GPU whose
// NVML calls take seconds delays neither the tick nor the other GPUs' samples.
package nvmlsource
