//! alloctrace (in progress)
