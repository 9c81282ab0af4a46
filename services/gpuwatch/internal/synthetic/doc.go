// Package synthetic makes up GPU samples from a documented model, for demos and tests on
// machines without a GPU. Every value is a closed-form function of the seed, the source's
// start and the sample time, so the same inputs give the same samples.
//
// The model, per GPU i, with t the seconds since start and ω = 2π / period:
//
//	load(t)  = 0.45 + 0.30·sin(ωt + φi) + 0.15·sin(7ωt + 2φi)         in [0, 0.9]
//	x(t)     = load(t) / 0.9                                         in [0, 1]
//	util     = clamp(100·x ± 2 of noise, 0, 100)     util_mem = 0.7·util
//	power    = 75 W + (700 W − 75 W)·x               power limit 700 W
//	energy   = ∫₀ᵗ power dt, exactly                 (a counter that never falls)
//	temp     = 30 °C + 30 °C·lag(x)                  lag: first order, τ = 60 s
//	memory   = 141 GB·(0.25 + 0.6·lag(x))            (caches fill as load stays up)
//	SM clock = 1980 MHz, falling linearly to 1410 MHz as power goes from 95 % to 100 %
//	           of the limit, with throttle reason 4 (software power cap) there, 1 (idle)
//	           below 5 % load, else 0
//	PCIe     = 2 GB/s·x out, 0.6 GB/s·x in;  memory clock 3201 MHz;  ECC errors 0
//
// φi comes from the seed and i, so GPUs of one host peak at different times. The noise on
// utilisation is a hash of the seed, the GPU and the whole second, not a random stream.
// lag(x) is the steady-state response of a first-order lag to each sine, so temperature
// peaks after power does.
package synthetic
