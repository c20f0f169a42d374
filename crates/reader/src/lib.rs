//! Streaming reader for alloctrace traces (in progress).
