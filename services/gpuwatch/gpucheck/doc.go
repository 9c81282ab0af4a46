// Command gpucheck checks gpuwatch on a real GPU: it starts a NATS server in-process,
// runs the gpuwatch binary against it, lets the GPUs idle for a few seconds, then runs a
// matrix-multiplication load (matmul.py, PyTorch) while it collects every published
// sample, and asserts that utilisation rises, that power rises and the energy counter
// grows with it, and that every reading NVML says is unsupported is absent from the
// samples. It prints what it checked and exits 1 when a check fails.
//
// run.sh builds and runs it; see the README's "GPU check".
package main
