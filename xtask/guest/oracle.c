/*
 * The independent oracle of the guest tests: counts from tracefs kprobe
 * events (not BPF), per process from its exec on, with the per-thread
 * windows the kernel runs (handle_mm_fault entry .. return).
 *
 * Input: /sys/kernel/tracing/trace with options/record-tgid and events
 *   fso/hmf  handle_mm_fault entry (addr=%x flags=%u regs=%u)
 *   fso/hmfr handle_mm_fault return (ret=%u)
 *   fso/wp   do_wp_page          fso/hwp do_huge_pmd_wp_page
 *   fso/shp  __split_huge_pmd, fso/hec do_huge_pmd_exec_cow (a patched
 *            kernel's): inside a fault, a PMD write-protect fault too (a
 *            private file THP split, or copied whole)
 *   fso/nar  folio_add_new_anon_rmap (before 6.3: page_add_new_anon_rmap)
 *   fso/dsp  fault_dirty_shared_page (a shared mapping's page dirtied:
 *            after do_wp_page, write-notify, counted "shared", not reuse)
 *   x86: exceptions/page_fault_user (error_code bit 0 = present)
 *   fso/acc ptep_set_access_flags (arm64 from 6.9: __ptep_set_access_flags),
 *   fso/accc contpte_ptep_set_access_flags, fso/hacc huge_pmd_set_accessed:
 *     the present-entry tail of a fault ("present" where no exception is seen)
 *   arm64: fso/abt do_mem_abort (far=%x esr=%x: FSC type 0x0c = permission;
 *          on the kprobe blacklist of the kernels tested, so usually absent),
 *          fso/unfold __contpte_try_unfold, fso/conv contpte_convert (pte=%x:
 *          PTE_CONT, bit 52, set when the block is folded, clear unfolded),
 *          fso/fold __contpte_try_fold
 *   sched/sched_process_exec
 *   trace_marker lines "faultscope phase LABEL" (written by faultscope
 *   right after it switches phase, or attaches) split the counts by phase;
 *   like faultscope's phases they hold for every process. A mark's switch
 *   is also preceded by "faultscope phase-switch LABEL": the counts between
 *   the two lines are the boundary's window, which faultscope may count on
 *   either side of it (the switch is one store between the two writes).
 * Every handle_mm_fault call of a process's threads counts, whoever asked
 * for it (the kernel's own accounting, mm_account_fault(), counts them all
 * for the current task): its origin is "user" (regs set, FAULT_FLAG_USER),
 * "kernel" (regs set, no FAULT_FLAG_USER: the kernel's fault on user
 * memory in a system call) or "gup" (regs NULL: get_user_pages).
 * Output, per process and per (process, phase), under the report's class
 * names (the keys the host compares with faultscope's classes):
 *   oracle tgid=N phase=ALL|LABEL faults=.. wp_faults=.. reuse=.. copy=..
 *          wp_shared=.. spurious=.. huge_pmd_wp=.. contpte_unfold=..
 *          contpte_fold=.. contpte_convert=.. contpte_try_unfold=..
 *          contpte_fold_attempt=.. nowp=.. completed=..
 * and the same split by origin (the contpte counts have none):
 *   oracle-origin tgid=N phase=ALL|LABEL origin=user|kernel|gup faults=.. ...
 * and, for each phase a mark started, the counts in the window before it
 * (counted in the phase before, as every count is counted in the phase
 * whose "faultscope phase" line came last):
 *   oracle-window tgid=N phase=LABEL faults=.. ...
 *   oracle-window-origin tgid=N phase=LABEL origin=user|kernel|gup faults=.. ...
 * completed (not a class) counts the calls that returned neither
 * VM_FAULT_RETRY nor an error: the faults mm_account_fault() counts.
 * A class whose events this guest's tracefs lacks (lib.sh refused them) is
 * "KEY=?", never a number, and a line "oracle unknown KEY: EVENT..." names
 * the missing events ("a|b": both alternatives missing).
 * Given address ranges (arguments NAME=0xSTART-0xEND, END exclusive), it
 * also splits the counts of each fault by the address handle_mm_fault got,
 * per range (ranges may overlap; a fault counts in each that holds it):
 *   oracle-range tgid=N phase=ALL|LABEL range=NAME faults=.. wp_faults=..
 *          reuse=.. copy=.. wp_shared=.. spurious=.. huge_pmd_wp=.. nowp=..
 * (the contpte counts are not faults and have no range). A range is only
 * addresses, over the whole trace: whatever was mapped there before counts
 * too, so a workload whose ranges are checked must not reuse them.
 * nowp (not a class) counts user write faults that completed without
 * reaching do_wp_page, do_huge_pmd_wp_page or a new anon folio; spurious
 * those of them whose exception says the page was present (or, without a
 * matching exception, that reached the present-entry tail).
 *
 * Usage: oracle [TRACEFS] [NAME=0xSTART-0xEND...] < trace; TRACEFS is
 * /sys/kernel/tracing unless given.
 *
 * Written in C and built static so that it runs fast under TCG and shares
 * no code with faultscope.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXT 4096
#define MAXP 512
#define MAXPH 64
#define NC 14
#define MAXR 16
#define NO 3

/* The counts, printed in this order under these names: the report's class
 * names, but for nowp and completed. */
enum { FAULTS, WP, REUSE, COPY, SHARED, SPURIOUS, HUGE, UNFOLD, FOLDED, CONVERT, TRYUNFOLD, FOLD, NOWP, COMPLETED };
static const char *origin_names[NO] = { "user", "kernel", "gup" };

/* The events (lib.sh oracle_event names). "exc" is the exception event:
 * the page_fault_user tracepoint (x86) or the kprobe fso/abt (arm64). */
enum { E_HMF, E_HMFR, E_WP, E_HWP, E_NAR, E_DSP, E_EXC, E_ACC, E_CONV, E_UNFOLD, E_FOLD, NE };
static const char *event_names[NE] = { "hmf", "hmfr", "wp", "hwp", "nar", "dsp",
				       "exc", "acc", "conv", "unfold", "fold" };
#define E(e) (1u << (e))
#define HMF (E(E_HMF) | E(E_HMFR))
#define PATHS (HMF | E(E_WP) | E(E_HWP) | E(E_NAR))

/* A count's name and the events it needs: all of `all`, and one of `any`
 * if any. Without "dsp" shared write-notify counts as reuse, as on
 * faultscope's side: reuse and copy need "nar" only. */
static const struct key { const char *name; unsigned all, any; } keys[NC] = {
	[FAULTS] = { "faults", HMF },
	[WP] = { "wp_faults", HMF | E(E_WP) },
	[REUSE] = { "reuse", HMF | E(E_WP) | E(E_NAR) },
	[COPY] = { "copy", HMF | E(E_WP) | E(E_NAR) },
	[SHARED] = { "wp_shared", HMF | E(E_WP) | E(E_DSP) },
	[SPURIOUS] = { "spurious", PATHS, E(E_EXC) | E(E_ACC) },
	[HUGE] = { "huge_pmd_wp", HMF | E(E_HWP) },
	[UNFOLD] = { "contpte_unfold", E(E_CONV) },
	[FOLDED] = { "contpte_fold", E(E_CONV) },
	[CONVERT] = { "contpte_convert", E(E_CONV) },
	[TRYUNFOLD] = { "contpte_try_unfold", E(E_UNFOLD) },
	[FOLD] = { "contpte_fold_attempt", E(E_FOLD) },
	[NOWP] = { "nowp", PATHS },
	[COMPLETED] = { "completed", HMF },
};

static unsigned have;  /* the events this guest's tracefs has */
static int known[NC]; /* the counts whose events it has */

static int exists(const char *tracefs, const char *path)
{
	char p[512];
	snprintf(p, sizeof p, "%s/%s", tracefs, path);
	return access(p, F_OK) == 0;
}

/* Whether the tracepoint at `path` is enabled (lib.sh enables it, or says
 * why not). */
static int enabled(const char *tracefs, const char *path)
{
	char p[512], c = 0;
	snprintf(p, sizeof p, "%s/%s/enable", tracefs, path);
	FILE *f = fopen(p, "r");
	if (!f)
		return 0;
	if (fread(&c, 1, 1, f) != 1)
		c = 0;
	fclose(f);
	return c == '1';
}

/* Which events exist, which counts they allow; "oracle unknown" lines for
 * the others. */
static void probe_events(const char *tracefs)
{
	for (int e = 0; e < NE; e++) {
		char p[64];
		snprintf(p, sizeof p, "events/fso/%s", e == E_EXC ? "abt" : event_names[e]);
		int ok = exists(tracefs, p);
		if (e == E_EXC)
			ok = ok || enabled(tracefs, "events/exceptions/page_fault_user");
		if (ok)
			have |= E(e);
	}
	for (int i = 0; i < NC; i++) {
		unsigned miss = keys[i].all & ~have;
		int any_missing = keys[i].any && !(keys[i].any & have);
		known[i] = !miss && !any_missing;
		if (known[i])
			continue;
		printf("oracle unknown %s:", keys[i].name);
		for (int e = 0; e < NE; e++)
			if (miss & E(e))
				printf(" %s", event_names[e]);
		if (any_missing) {
			const char *sep = " ";
			for (int e = 0; e < NE; e++)
				if (keys[i].any & E(e)) {
					printf("%s%s", sep, event_names[e]);
					sep = "|";
				}
		}
		printf("\n");
	}
}

struct thread {
	int pid, tgid, in, origin, wp, nar, hwp, acc, dsp, write;
	int hwpr; /* the last call, a PMD write-protect fault, returned VM_FAULT_RETRY */
	unsigned long addr;              /* of the fault being handled */
	unsigned long exc_addr, present; /* of the last exception */
	int exc;
};
/* The counts of a process in each range, whole run and per phase. */
struct rcounts { unsigned long c[MAXR][NC]; unsigned long ph[MAXPH][MAXR][NC]; };
struct proc {
	int tgid, exec;
	unsigned long c[NC];
	unsigned long ph[MAXPH][NC];
	unsigned long o[NO][NC];          /* by origin, whole run */
	unsigned long oph[MAXPH][NO][NC]; /* by origin, per phase */
	unsigned long win[MAXPH][NC];     /* in the window before each phase */
	unsigned long owin[MAXPH][NO][NC];
	struct rcounts *r;
};
struct range { char name[64]; unsigned long start, end; };

static struct thread threads[MAXT];
static struct proc procs[MAXP];
static int nthreads, nprocs, nexec;
static char labels[MAXPH][80];
static int nph; /* phases seen; counts go to the last one */
static int switching; /* in the window before phase nph (a "phase-switch" line came) */
static unsigned long unknown_tgid; /* lines whose tgid the trace did not know */
static struct range ranges[MAXR];
static int nranges;

/* The counts a fault is split by its address in: those counted when
 * handle_mm_fault returns. */
static int per_fault(int what)
{
	return what <= HUGE || what == NOWP || what == COMPLETED;
}

static struct thread *thread(int pid)
{
	for (int i = 0; i < nthreads; i++)
		if (threads[i].pid == pid)
			return &threads[i];
	if (nthreads == MAXT) { fprintf(stderr, "oracle: too many threads\n"); exit(1); }
	threads[nthreads].pid = pid;
	return &threads[nthreads++];
}

static struct proc *proc(int tgid)
{
	for (int i = 0; i < nprocs; i++)
		if (procs[i].tgid == tgid)
			return &procs[i];
	if (nprocs == MAXP) { fprintf(stderr, "oracle: too many processes\n"); exit(1); }
	procs[nprocs].tgid = tgid;
	return &procs[nprocs++];
}

static void count(struct proc *p, int what)
{
	p->c[what]++;
	if (nph)
		p->ph[nph - 1][what]++;
	if (switching)
		p->win[nph][what]++;
}

/* A count of a fault of origin `o` at address `addr`: also by origin, and
 * in each range holding it. */
static void count_at(struct proc *p, int what, int o, unsigned long addr)
{
	count(p, what);
	p->o[o][what]++;
	if (nph)
		p->oph[nph - 1][o][what]++;
	if (switching)
		p->owin[nph][o][what]++;
	for (int i = 0; i < nranges; i++) {
		if (addr < ranges[i].start || addr >= ranges[i].end)
			continue;
		if (!p->r && !(p->r = calloc(1, sizeof *p->r))) { fprintf(stderr, "oracle: out of memory\n"); exit(1); }
		p->r->c[i][what]++;
		if (nph)
			p->r->ph[nph - 1][i][what]++;
	}
}

/* NAME=0xSTART-0xEND */
static int parse_range(const char *arg)
{
	const char *eq = strchr(arg, '=');
	if (!eq || eq == arg || eq - arg >= (long)sizeof ranges[0].name || nranges == MAXR)
		return -1;
	char *dash, *end;
	unsigned long a = strtoul(eq + 1, &dash, 16), b;
	if (dash == eq + 1 || *dash != '-')
		return -1;
	b = strtoul(dash + 1, &end, 16);
	if (end == dash + 1 || *end || b <= a)
		return -1;
	struct range *r = &ranges[nranges++];
	memcpy(r->name, arg, eq - arg);
	r->name[eq - arg] = 0;
	r->start = a;
	r->end = b;
	return 0;
}

/* A numeric field "name=value"; decimal, or hex with 0x. */
static unsigned long field(const char *line, const char *name)
{
	const char *p = strstr(line, name);
	return p ? strtoul(p + strlen(name), NULL, 0) : 0;
}

static void print_counts(const unsigned long *c, int faults_only)
{
	for (int i = 0; i < NC; i++) {
		if (faults_only && !per_fault(i))
			continue;
		if (known[i])
			printf(" %s=%lu", keys[i].name, c[i]);
		else
			printf(" %s=?", keys[i].name);
	}
	printf("\n");
}

static void print(int tgid, const char *label, const unsigned long *c)
{
	printf("oracle tgid=%d phase=%s", tgid, label);
	print_counts(c, 0);
}

static void print_origins(const struct proc *p)
{
	for (int j = -1; j < nph; j++)
		for (int o = 0; o < NO; o++) {
			printf("oracle-origin tgid=%d phase=%s origin=%s", p->tgid, j < 0 ? "ALL" : labels[j],
			       origin_names[o]);
			print_counts(j < 0 ? p->o[o] : p->oph[j][o], 1);
		}
}

/* The windows before the phases a mark started (a "phase-switch" line
 * came before their "phase" line). */
static char windowed[MAXPH];

static void print_windows(const struct proc *p)
{
	for (int j = 0; j < nph; j++) {
		if (!windowed[j])
			continue;
		printf("oracle-window tgid=%d phase=%s", p->tgid, labels[j]);
		print_counts(p->win[j], 0);
		for (int o = 0; o < NO; o++) {
			printf("oracle-window-origin tgid=%d phase=%s origin=%s", p->tgid, labels[j],
			       origin_names[o]);
			print_counts(p->owin[j][o], 1);
		}
	}
}

static void print_ranges(const struct proc *p)
{
	static const unsigned long zero[NC];
	for (int i = 0; i < nranges; i++)
		for (int j = -1; j < nph; j++) {
			const unsigned long *c = !p->r ? zero : j < 0 ? p->r->c[i] : p->r->ph[j][i];
			printf("oracle-range tgid=%d phase=%s range=%s", p->tgid, j < 0 ? "ALL" : labels[j],
			       ranges[i].name);
			print_counts(c, 1);
		}
}

int main(int argc, char **argv)
{
	char line[1024];
	const char *tracefs = "/sys/kernel/tracing";
	for (int i = 1; i < argc; i++) {
		if (!strchr(argv[i], '='))
			tracefs = argv[i];
		else if (parse_range(argv[i])) {
			fprintf(stderr, "oracle: bad range %s (NAME=0xSTART-0xEND, at most %d)\n", argv[i], MAXR);
			return 2;
		}
	}
	probe_events(tracefs);
	unsigned long lines = 0;
	while (fgets(line, sizeof line, stdin)) {
		if (line[0] == '#')
			continue;
		/* "comm-PID (  TGID) [CPU] ..." */
		char *close = strstr(line, ") [");
		if (!close)
			continue;
		char *open = close;
		while (open > line && *open != '(')
			open--;
		if (*open != '(' || open < line + 2)
			continue;
		/* "(-------)" where the tgid cache missed this pid: then its
		 * tgid is the one seen before, or its own pid (an exec'd
		 * process leads its thread group). */
		char *num = open + 1;
		while (*num == ' ')
			num++;
		int tgid = *num >= '0' && *num <= '9' ? atoi(num) : -1;
		char *dash = open - 1;
		while (dash > line && *dash == ' ')
			dash--;
		while (dash > line && *dash >= '0' && *dash <= '9')
			dash--;
		if (*dash != '-')
			continue;
		int pid = atoi(dash + 1);
		if (tgid < 0) {
			unknown_tgid++;
			tgid = pid;
			for (int i = 0; i < nthreads; i++)
				if (threads[i].pid == pid)
					tgid = threads[i].tgid;
		}
		const char *ev = close + 3;
		lines++;
		const char *m = strstr(ev, "faultscope phase ");
		if (m && strstr(ev, "tracing_mark_write: ")) {
			if (nph == MAXPH) { fprintf(stderr, "oracle: too many phases\n"); exit(1); }
			snprintf(labels[nph], sizeof labels[nph], "%s", m + strlen("faultscope phase "));
			labels[nph][strcspn(labels[nph], "\n")] = 0;
			windowed[nph] = switching;
			switching = 0;
			nph++;
			continue;
		}
		if (strstr(ev, "faultscope phase-switch ") && strstr(ev, "tracing_mark_write: ")) {
			if (nph == MAXPH) { fprintf(stderr, "oracle: too many phases\n"); exit(1); }
			switching = 1;
			continue;
		}
		struct proc *p = proc(tgid);
		if (strstr(ev, " sched_process_exec: ")) {
			nexec += !p->exec;
			p->exec = 1;
			continue;
		}
		if (!p->exec)
			continue;
		struct thread *t = thread(pid);
		t->tgid = tgid;
		if (strstr(ev, " page_fault_user: ") || strstr(ev, " page_fault_kernel: ")) {
			t->hwpr = 0;
			t->exc = 1;
			t->exc_addr = field(ev, "address=");
			t->present = field(ev, "error_code=") & 1;
		} else if (strstr(ev, " abt: ")) {
			t->hwpr = 0;
			t->exc = 1;
			t->exc_addr = field(ev, "far=");
			t->present = (field(ev, "esr=") & 0x3c) == 0x0c;
		} else if (strstr(ev, " hmf: ")) {
			unsigned long flags = field(ev, "flags=");
			unsigned long regs = field(ev, "regs=");
			t->in = 1;
			t->origin = !regs ? 2 : (flags & 64) ? 0 : 1;
			t->write = (flags & 1) != 0;
			t->addr = field(ev, "addr=");
			t->wp = t->nar = t->hwp = t->acc = t->dsp = 0;
		} else if (strstr(ev, " hmfr: ")) {
			if (t->in) {
				unsigned long ret = field(ev, "ret=");
				unsigned long a = t->addr;
				int o = t->origin;
				count_at(p, FAULTS, o, a);
				/* VM_FAULT_ERROR | VM_FAULT_RETRY */
				if (!(ret & (0x873 | 0x400)))
					count_at(p, COMPLETED, o, a);
				if (t->wp) {
					count_at(p, WP, o, a);
					count_at(p, t->dsp ? SHARED : t->nar ? COPY : REUSE, o, a);
				} else if ((t->hwp || t->hwpr) && t->nar) {
					/* the THP itself copied, or the page copied
					 * from the file after the PMD split (in this
					 * call, or in the one it retries): no PTE fault */
					count_at(p, COPY, o, a);
				}
				t->hwpr = t->hwp && (ret & 0x400);
				if (t->hwp)
					count_at(p, HUGE, o, a);
				if (t->write && !t->wp && !t->hwp && !t->nar && !t->dsp && !(ret & (0x873 | 0x400))) {
					count_at(p, NOWP, o, a);
					/* get_user_pages takes no exception of its own */
					int same = o != 2 && t->exc && (t->exc_addr >> 12) == (t->addr >> 12);
					if (same ? t->present : t->acc)
						count_at(p, SPURIOUS, o, a);
				}
			}
			t->in = 0;
		} else if (strstr(ev, " wp: ")) {
			if (t->in) t->wp = 1;
		} else if (strstr(ev, " nar: ")) {
			if (t->in) t->nar = 1;
		} else if (strstr(ev, " dsp: ")) {
			if (t->in) t->dsp = 1;
		} else if (strstr(ev, " hwp: ") || strstr(ev, " shp: ") || strstr(ev, " hec: ")) {
			if (t->in) t->hwp = 1;
		} else if (strstr(ev, " acc: ") || strstr(ev, " accc: ") || strstr(ev, " hacc: ")) {
			if (t->in) t->acc = 1;
		} else if (strstr(ev, " unfold: ")) {
			count(p, TRYUNFOLD);
		} else if (strstr(ev, " conv: ")) {
			count(p, CONVERT);
			count(p, field(ev, "pte=") & (1UL << 52) ? FOLDED : UNFOLD);
		} else if (strstr(ev, " fold: ")) {
			count(p, FOLD);
		}
	}
	for (int i = 0; i < nprocs; i++) {
		if (!procs[i].exec)
			continue;
		print(procs[i].tgid, "ALL", procs[i].c);
		for (int j = 0; j < nph; j++)
			print(procs[i].tgid, labels[j], procs[i].ph[j]);
		print_origins(&procs[i]);
		print_windows(&procs[i]);
		print_ranges(&procs[i]);
	}
	/* For the host's error messages: what the trace held. */
	printf("oracle: %lu trace lines, %lu with an unknown tgid, %d processes exec'd:", lines,
	       unknown_tgid, nexec);
	for (int i = 0; i < nprocs; i++)
		if (procs[i].exec)
			printf(" %d", procs[i].tgid);
	printf("; phases:");
	for (int j = 0; j < nph; j++)
		printf(" %s", labels[j]);
	printf("\n");
	return 0;
}
