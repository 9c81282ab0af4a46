package nvmlsource

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrLibraryNotFound says the NVML library (the NVIDIA driver's libnvidia-ml) cannot be
// loaded: the host has no NVIDIA driver, or it is not on the loader's path.
var ErrLibraryNotFound = errors.New("NVML library not found")

// Load loads the NVML library at path (a file name the loader searches for, or a path) and
// initialises it. The caller shuts it down with Shutdown.
func Load(path string) (nvml.Interface, error) {
	lib := nvml.New(nvml.WithLibraryPath(path))
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
		return lib, nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Errorf("%w: %s (is the NVIDIA driver installed?); "+
			"on a host without an NVIDIA GPU set GPUWATCH_SOURCE=synthetic or GPUWATCH_SOURCE=replay",
			ErrLibraryNotFound, whyNotLoaded(path))
	default:
		return nil, fmt.Errorf("cannot initialise NVML from %s: %s (%s)", path, codeName(ret), ret.Error())
	}
}

// whyNotLoaded asks the dynamic loader why path does not load: go-nvml's Init keeps only
// ERROR_LIBRARY_NOT_FOUND, and the loader's own message ("cannot open shared object file")
// is what a person needs.
func whyNotLoaded(path string) string {
	lib := dl.New(path, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := lib.Open(); err != nil {
		return err.Error()
	}
	_ = lib.Close()
	return "cannot load " + path
}
