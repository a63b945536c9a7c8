//go:build !race

package engine

// raceEnabled: the race detector slows the engine down ~10×, so the
// heaviest tests run smaller under it.
const raceEnabled = false
