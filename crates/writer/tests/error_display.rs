//! Errors print as words (issue 10, item 3): `Io` as the system's text for
//! its errno, not `Io(28)`.

use alloctrace_writer::Error;

#[test]
fn errors_print_as_words() {
    assert_eq!(
        Error::Io(libc::ENOSPC).to_string(),
        "No space left on device"
    );
    assert_eq!(Error::Io(libc::EBADF).to_string(), "Bad file descriptor");
    assert_eq!(
        Error::Io(libc::ENXIO).to_string(),
        "No such device or address"
    );
    assert_eq!(Error::Io(99999).to_string(), "unknown error 99999");
    assert_eq!(
        Error::BadConfig("buffer_size must be 0 (default) or 4096..16777216").to_string(),
        "bad configuration: buffer_size must be 0 (default) or 4096..16777216"
    );
    assert_eq!(
        Error::AlreadyStarted.to_string(),
        "tracing is already started"
    );
    assert_eq!(Error::NotStarted.to_string(), "tracing is not started");
    let boxed: Box<dyn std::error::Error> = Box::new(Error::Busy);
    assert_eq!(
        boxed.to_string(),
        "called from inside the snapshot callback"
    );
}
