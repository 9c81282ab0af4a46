// Package exporter exposes the latest GPU samples on /metrics under dcgm-exporter's metric
// names and labels (DCGM_FI_DEV_GPU_UTIL{gpu,UUID,modelName,Hostname} and so on), so a
// dashboard or alert written for dcgm-exporter reads gpuwatch for these readings. A reading
// absent from the sample is absent from /metrics too, never exported as zero.
package exporter
