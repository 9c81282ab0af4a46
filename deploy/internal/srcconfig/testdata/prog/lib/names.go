package lib

const subsystem = "lib"
