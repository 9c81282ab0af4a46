package nvmlsource

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// codeOutOfRange labels a reading NVML returned but that cannot be right (a utilisation
// over 100 %, more memory used than there is); it is dropped like a failed one.
const codeOutOfRange = "OUT_OF_RANGE"

// codes are the metric label values of NVML return codes: a fixed list, so the label stays
// bounded whatever the driver returns. go-nvml's Return.Error gives the driver's prose once
// the library is loaded, which is not a stable label.
var codes = map[nvml.Return]string{
	nvml.ERROR_UNINITIALIZED:           "ERROR_UNINITIALIZED",
	nvml.ERROR_INVALID_ARGUMENT:        "ERROR_INVALID_ARGUMENT",
	nvml.ERROR_NOT_SUPPORTED:           "ERROR_NOT_SUPPORTED",
	nvml.ERROR_NO_PERMISSION:           "ERROR_NO_PERMISSION",
	nvml.ERROR_NOT_FOUND:               "ERROR_NOT_FOUND",
	nvml.ERROR_INSUFFICIENT_SIZE:       "ERROR_INSUFFICIENT_SIZE",
	nvml.ERROR_INSUFFICIENT_POWER:      "ERROR_INSUFFICIENT_POWER",
	nvml.ERROR_DRIVER_NOT_LOADED:       "ERROR_DRIVER_NOT_LOADED",
	nvml.ERROR_TIMEOUT:                 "ERROR_TIMEOUT",
	nvml.ERROR_IRQ_ISSUE:               "ERROR_IRQ_ISSUE",
	nvml.ERROR_LIBRARY_NOT_FOUND:       "ERROR_LIBRARY_NOT_FOUND",
	nvml.ERROR_FUNCTION_NOT_FOUND:      "ERROR_FUNCTION_NOT_FOUND",
	nvml.ERROR_CORRUPTED_INFOROM:       "ERROR_CORRUPTED_INFOROM",
	nvml.ERROR_GPU_IS_LOST:             "ERROR_GPU_IS_LOST",
	nvml.ERROR_RESET_REQUIRED:          "ERROR_RESET_REQUIRED",
	nvml.ERROR_OPERATING_SYSTEM:        "ERROR_OPERATING_SYSTEM",
	nvml.ERROR_LIB_RM_VERSION_MISMATCH: "ERROR_LIB_RM_VERSION_MISMATCH",
	nvml.ERROR_IN_USE:                  "ERROR_IN_USE",
	nvml.ERROR_MEMORY:                  "ERROR_MEMORY",
	nvml.ERROR_NO_DATA:                 "ERROR_NO_DATA",
	nvml.ERROR_NOT_READY:               "ERROR_NOT_READY",
	nvml.ERROR_GPU_NOT_FOUND:           "ERROR_GPU_NOT_FOUND",
	nvml.ERROR_INVALID_STATE:           "ERROR_INVALID_STATE",
	nvml.ERROR_UNKNOWN:                 "ERROR_UNKNOWN",
}

// codeName returns ret's bounded label: its constant's name, or "other".
func codeName(ret nvml.Return) string {
	switch ret {
	case nvml.SUCCESS:
		return "SUCCESS"
	case outOfRange:
		return codeOutOfRange
	}
	if c, ok := codes[ret]; ok {
		return c
	}
	return "other"
}

// unsupported reports whether ret means the reading will not work on this GPU (until a
// driver or configuration change), as against failing this once.
func unsupported(ret nvml.Return) bool {
	switch ret {
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_NO_PERMISSION:
		return true
	}
	return false
}
