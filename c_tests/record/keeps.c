/* The program of crates/cli/tests/record_keeps.rs: what `alloctrace record`
 * leaves to the program it runs.
 *
 *   keeps fds REPORT       writes "closed A B" (which of 0, 1, 2 it found
 *                          closed), then opens REPORT and writes "fd N" (the
 *                          descriptor open returned) to it, then "stdout" to
 *                          fd 1 (into REPORT when open returned 1). Exits 3.
 *   keeps wait READY GOT   catches SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2,
 *                          writes its pid to READY (via READY.tmp and a
 *                          rename), waits for one of them (or for any other
 *                          signal to end it), writes its number to GOT and
 *                          exits 40.
 *   keeps ignored          writes the numbers of the signals it inherited
 *                          ignored (1 to 31), space-separated, to stdout. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t got;

static void handler(int sig) { got = sig; }

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

static int fds(const char *report) {
    char closed[32] = "closed";
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
            size_t n = strlen(closed);
            snprintf(closed + n, sizeof closed - n, " %d", fd);
        }
    }
    int fd = open(report, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return 2;
    dprintf(fd, "%s\nfd %d\n", closed, fd);
    (void)!write(1, "stdout\n", 7);
    return 3;
}

static int wait_for_signal(const char *ready, const char *got_path) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &sa, NULL);
    char tmp[4096], text[32];
    snprintf(tmp, sizeof tmp, "%s.tmp", ready);
    snprintf(text, sizeof text, "%d\n", (int)getpid());
    if (write_file(tmp, text) != 0 || rename(tmp, ready) != 0) return 2;
    while (!got) pause();
    snprintf(text, sizeof text, "%d\n", (int)got);
    if (write_file(got_path, text) != 0) return 2;
    return 40;
}

static int ignored(void) {
    const char *sep = "";
    for (int sig = 1; sig < 32; sig++) {
        struct sigaction old;
        if (sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_IGN) {
            printf("%s%d", sep, sig);
            sep = " ";
        }
    }
    printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    void *keep = malloc(100);
    int code = 2;
    if (argc == 3 && strcmp(argv[1], "fds") == 0) {
        code = fds(argv[2]);
    } else if (argc == 4 && strcmp(argv[1], "wait") == 0) {
        code = wait_for_signal(argv[2], argv[3]);
    } else if (argc == 2 && strcmp(argv[1], "ignored") == 0) {
        code = ignored();
    } else {
        fputs("usage: keeps fds REPORT | keeps wait READY GOT | keeps ignored\n", stderr);
    }
    free(keep);
    return code;
}
