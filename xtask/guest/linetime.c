/*
 * linetime OUT PATTERN CMD [ARGS...]: runs CMD with its stdout and stderr
 * into a pipe, copies every line to its own stdout, and the first time a
 * line contains PATTERN writes to OUT the nanoseconds (CLOCK_MONOTONIC)
 * from just before CMD was started to that line. Exits as CMD did.
 *
 * The overhead benchmark times a tracer's attach with it, from outside the
 * tracer: faultscope's "faultscope: measuring" line, bpftrace's BEGIN
 * output (bpftrace fires BEGIN once every probe is attached). OUT is
 * written to OUT.tmp and renamed, so a reader polling for OUT never sees it
 * half written.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: linetime OUT PATTERN CMD [ARGS...]\n");
		return 2;
	}
	const char *out = argv[1], *pattern = argv[2];
	int p[2];
	if (pipe(p) != 0) {
		perror("linetime: pipe");
		return 2;
	}
	/* The shell's SIGINT for the tracer goes to CMD; we stay to copy its
	 * last lines (bpftrace prints its maps on SIGINT). */
	signal(SIGINT, SIG_IGN);
	long long t0 = now_ns();
	pid_t pid = fork();
	if (pid < 0) {
		perror("linetime: fork");
		return 2;
	}
	if (pid == 0) {
		signal(SIGINT, SIG_DFL);
		dup2(p[1], 1);
		dup2(p[1], 2);
		close(p[0]);
		close(p[1]);
		execvp(argv[3], argv + 3);
		fprintf(stderr, "linetime: exec %s failed\n", argv[3]);
		_exit(127);
	}
	close(p[1]);
	/* The child's pid, for whoever must signal the tracer itself. */
	char pidfile[4096];
	snprintf(pidfile, sizeof pidfile, "%s.pid", out);
	FILE *pf = fopen(pidfile, "w");
	if (pf) {
		fprintf(pf, "%d\n", (int)pid);
		fclose(pf);
	}
	FILE *in = fdopen(p[0], "r");
	char *line = NULL;
	size_t cap = 0;
	int seen = 0;
	while (getline(&line, &cap, in) >= 0) {
		if (!seen && strstr(line, pattern)) {
			long long dt = now_ns() - t0;
			char tmp[4096];
			snprintf(tmp, sizeof tmp, "%s.tmp", out);
			FILE *f = fopen(tmp, "w");
			if (f) {
				fprintf(f, "%lld\n", dt);
				fclose(f);
				rename(tmp, out);
			}
			seen = 1;
		}
		fputs(line, stdout);
		fflush(stdout);
	}
	int st = 0;
	if (waitpid(pid, &st, 0) < 0)
		return 2;
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}
