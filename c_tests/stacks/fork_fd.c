/* fork_fd: forks; the child lists the files its descriptors name
 * (/proc/self/fd), one "fd PATH" line each on stdout, and exits. The
 * parent waits for it. Under the shim, the child must hold no descriptor
 * of the parent's trace. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        DIR *d = opendir("/proc/self/fd");
        if (!d)
            _exit(1);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char link[300], target[4096];
            snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n < 0)
                continue;
            target[n] = 0;
            printf("fd %s %s\n", e->d_name, target);
        }
        closedir(d);
        printf("child %d parent %d\n", (int)getpid(), (int)getppid());
        fflush(stdout);
        exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    printf("parent %d\n", (int)getpid());
    return 0;
}
