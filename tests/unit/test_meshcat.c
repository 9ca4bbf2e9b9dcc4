/* meshcat's pure modules: command line (cli.c), receiver file names and
 * the temporaries files are received into (names.c), progress and summary
 * formatting (progress.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>  /* cmocka.h needs it */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmocka.h>

#include "cli.h"
#include "names.h"
#include "progress.h"

#define MAXARGS 200

/* ------------------------------------------------------------------------
 * Command line helpers
 * ------------------------------------------------------------------------ */

struct cmdline {
    char *argv[MAXARGS + 1];
    int argc;
    char err[256];
    struct mc_args a;
    enum mc_parse_result r;
};

/* Parse "meshcat" + @args (NULL-terminated) into @c. */
static enum mc_parse_result run(struct cmdline *c, const char *const *args)
{
    c->argc = 0;
    c->argv[c->argc++] = "meshcat";
    for (; *args; args++) {
        assert_true(c->argc < MAXARGS);
        c->argv[c->argc++] = (char *)*args;   /* the parser never writes the strings */
    }
    c->argv[c->argc] = NULL;
    snprintf(c->err, sizeof c->err, "unset");
    c->r = mc_parse_args(c->argc, c->argv, &c->a, c->err, sizeof c->err);
    return c->r;
}
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define RUN(c, ...) run(c, ARGS(__VA_ARGS__))

/* Parse and expect success. */
#define OK(c, ...)                                                        \
    do {                                                                  \
        if (RUN(c, __VA_ARGS__) != MC_PARSE_OK)                           \
            fail_msg("expected OK, got %d: %s", (c)->r, (c)->err);       \
        assert_string_equal((c)->err, "");                                \
    } while (0)

/* @args: the text the error must mention, then the arguments. */
static void expect_usage(const char *const *args)
{
    struct cmdline c;
    const char *needle = args[0];

    if (run(&c, args + 1) != MC_PARSE_USAGE)
        fail_msg("expected a usage error mentioning '%s', got %d", needle, c.r);
    if (!strstr(c.err, needle))
        fail_msg("error '%s' does not mention '%s'", c.err, needle);
    assert_null(strchr(c.err, '\n'));
}
/* USAGE(needle, args...): the needle comes first, args may be none. */
#define USAGE(...) expect_usage(ARGS(__VA_ARGS__))

static void assert_ep(const struct mc_endpoint *e, const char *host, int port)
{
    assert_string_equal(e->host, host);
    assert_int_equal(e->port, port);
}

/* ------------------------------------------------------------------------
 * Command line: accepted forms
 * ------------------------------------------------------------------------ */

static void test_cli_recv_forms(void **state)
{
    struct cmdline c;
    (void)state;

    OK(&c, "-l");
    assert_int_equal(c.a.mode, MC_RECV);
    assert_ep(&c.a.listen, "", MC_DEFAULT_PORT);
    assert_null(c.a.output);
    assert_false(c.a.force);
    assert_int_equal(c.a.nto, 0);
    assert_int_equal(c.a.nfiles, 0);

    OK(&c, "-l", ":9000");
    assert_ep(&c.a.listen, "", 9000);
    OK(&c, "-l", "10.0.0.1");
    assert_ep(&c.a.listen, "10.0.0.1", 7471);
    OK(&c, "-l", "10.0.0.1:9000");
    assert_ep(&c.a.listen, "10.0.0.1", 9000);
    OK(&c, "-l", "[fe80::1]:9000");
    assert_ep(&c.a.listen, "fe80::1", 9000);
    OK(&c, "-l", "[fe80::1]");
    assert_ep(&c.a.listen, "fe80::1", 7471);
    OK(&c, "-l", "::1");
    assert_ep(&c.a.listen, "::1", 7471);
    OK(&c, "--listen=:9001");
    assert_ep(&c.a.listen, "", 9001);
    OK(&c, "--listen", "10.0.0.2");
    assert_ep(&c.a.listen, "10.0.0.2", 7471);

    /* -p is the default for a spec without a port, wherever it stands */
    OK(&c, "-l", "-p", "9000");
    assert_ep(&c.a.listen, "", 9000);
    OK(&c, "-l", "10.0.0.1", "-p", "9000");
    assert_ep(&c.a.listen, "10.0.0.1", 9000);
    OK(&c, "-p", "9000", "-l", ":8000");
    assert_ep(&c.a.listen, "", 8000);

    OK(&c, "-l", ":9000", "-o", "/data/in", "-f");
    assert_string_equal(c.a.output, "/data/in");
    assert_true(c.a.force);
    OK(&c, "-o", "out.bin", "--force", "-l");
    assert_int_equal(c.a.mode, MC_RECV);
    assert_string_equal(c.a.output, "out.bin");
    assert_true(c.a.force);
    assert_ep(&c.a.listen, "", 7471);
    OK(&c, "-lf");                      /* a cluster: -l without spec, -f */
    assert_int_equal(c.a.mode, MC_RECV);
    assert_true(c.a.force);
    OK(&c, "-l", "--output=dir");
    assert_string_equal(c.a.output, "dir");
    OK(&c, "-l", "-odir");
    assert_string_equal(c.a.output, "dir");
}

static void test_cli_send_forms(void **state)
{
    struct cmdline c;
    (void)state;

    OK(&c, "node1");
    assert_int_equal(c.a.mode, MC_SEND);
    assert_int_equal(c.a.nto, 1);
    assert_ep(&c.a.to[0], "node1", 7471);
    assert_int_equal(c.a.nfiles, 0);
    assert_null(c.a.files);

    const char *fa = "a.bin", *fb = "dir/b.bin";
    OK(&c, "node1:9000", fa, fb);
    assert_ep(&c.a.to[0], "node1", 9000);
    assert_int_equal(c.a.nfiles, 2);
    assert_ptr_equal(c.a.files[0], fa);      /* into argv, not copies */
    assert_ptr_equal(c.a.files[1], fb);

    OK(&c, "-p", "9000", "node1", "f");
    assert_ep(&c.a.to[0], "node1", 9000);
    OK(&c, "node1", "-p", "9000", "f");
    assert_ep(&c.a.to[0], "node1", 9000);
    OK(&c, "node1", "--port=9001");
    assert_ep(&c.a.to[0], "node1", 9001);
    OK(&c, "-p9002", "node1");
    assert_ep(&c.a.to[0], "node1", 9002);

    OK(&c, "[fe80::1]:9000", "f");
    assert_ep(&c.a.to[0], "fe80::1", 9000);
    OK(&c, "fe80::2", "f");
    assert_ep(&c.a.to[0], "fe80::2", 7471);
    OK(&c, "10.0.0.2", "-");
    assert_int_equal(c.a.nfiles, 1);
    assert_string_equal(c.a.files[0], "-");

    /* options after operands, and "--" */
    OK(&c, "node1", "a", "-v", "b", "--timeout", "3");
    assert_int_equal(c.a.verbose, 1);
    assert_true(c.a.timeout_s == 3.0);
    assert_int_equal(c.a.nfiles, 2);
    assert_string_equal(c.a.files[0], "a");
    assert_string_equal(c.a.files[1], "b");
    OK(&c, "node1", "--", "-f", "--to");
    assert_int_equal(c.a.nfiles, 2);
    assert_string_equal(c.a.files[0], "-f");
    assert_string_equal(c.a.files[1], "--to");
    assert_false(c.a.force);
    OK(&c, "-q", "--", "node1", "x");
    assert_ep(&c.a.to[0], "node1", 7471);
    assert_int_equal(c.a.nfiles, 1);
    assert_int_equal(c.a.verbose, -1);
}

static void test_cli_permutes_argv(void **state)
{
    struct cmdline c;
    (void)state;

    OK(&c, "node1", "a", "-p", "9000", "b", "-v", "c");
    assert_int_equal(c.argc, 8);
    const char *want[] = {"meshcat", "-p", "9000", "-v", "node1", "a", "b", "c"};
    for (int k = 0; k < 8; k++)
        assert_string_equal(c.argv[k], want[k]);
    assert_ptr_equal(c.a.files, &c.argv[5]);
    assert_null(c.argv[8]);
}

static void test_cli_fanout_forms(void **state)
{
    struct cmdline c;
    (void)state;

    OK(&c, "--to", "a,b:9000,[fe80::1]:7000,fe80::2", "f1", "f2");
    assert_int_equal(c.a.mode, MC_SEND);
    assert_int_equal(c.a.nto, 4);
    assert_ep(&c.a.to[0], "a", 7471);
    assert_ep(&c.a.to[1], "b", 9000);
    assert_ep(&c.a.to[2], "fe80::1", 7000);
    assert_ep(&c.a.to[3], "fe80::2", 7471);
    assert_int_equal(c.a.nfiles, 2);
    assert_string_equal(c.a.files[0], "f1");
    assert_string_equal(c.a.files[1], "f2");

    OK(&c, "--to=a,b");                 /* stdin */
    assert_int_equal(c.a.nto, 2);
    assert_int_equal(c.a.nfiles, 0);
    assert_null(c.a.files);
    OK(&c, "--to", "a", "f", "--to", "b:1");   /* lists add up */
    assert_int_equal(c.a.nto, 2);
    assert_ep(&c.a.to[1], "b", 1);
    assert_int_equal(c.a.nfiles, 1);
    OK(&c, "--to", "a,b", "-p", "9000");
    assert_ep(&c.a.to[0], "a", 9000);
    assert_ep(&c.a.to[1], "b", 9000);
    OK(&c, "--to", "a:1,a:2");          /* same host, other port: fine */
    assert_int_equal(c.a.nto, 2);
    OK(&c, "--to", "a", "./x:1");       /* a path is never a HOST */
    assert_string_equal(c.a.files[0], "./x:1");

    char list[64 * 8];
    size_t n = 0;
    for (int k = 0; k < MC_MAX_TO; k++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%sh%d", k ? "," : "", k);
    OK(&c, "--to", list, "f");
    assert_int_equal(c.a.nto, MC_MAX_TO);
    assert_ep(&c.a.to[63], "h63", 7471);
}

static void test_cli_options(void **state)
{
    struct cmdline c;
    (void)state;

    OK(&c, "node1");
    assert_true(c.a.timeout_s == MC_DEFAULT_TIMEOUT_S);
    assert_true(c.a.timeout_s == 10.0);
    assert_int_equal(c.a.chunk, 1024 * 1024);
    assert_int_equal(c.a.window, 8);
    assert_int_equal(c.a.verbose, 0);
    assert_false(c.a.force);

    OK(&c, "node1", "-t", "2.5");
    assert_true(c.a.timeout_s == 2.5);
    OK(&c, "node1", "--timeout=0.1");
    assert_true(c.a.timeout_s == 0.1);
    OK(&c, "node1", "-t3");
    assert_true(c.a.timeout_s == 3.0);

    OK(&c, "node1", "--chunk", "4K");
    assert_int_equal(c.a.chunk, 4096);
    OK(&c, "node1", "--chunk=64M");
    assert_int_equal(c.a.chunk, 64u << 20);
    OK(&c, "node1", "--chunk", "65536");
    assert_int_equal(c.a.chunk, 65536);
    OK(&c, "node1", "--chunk", "2m");
    assert_int_equal(c.a.chunk, 2u << 20);
    OK(&c, "node1", "--chunk", "8KiB");
    assert_int_equal(c.a.chunk, 8192);
    OK(&c, "node1", "--chunk", "4096");
    assert_int_equal(c.a.chunk, 4096);

    OK(&c, "node1", "--window", "1");
    assert_int_equal(c.a.window, 1);
    OK(&c, "node1", "--window=64");
    assert_int_equal(c.a.window, 64);

    OK(&c, "node1");
    assert_int_equal(c.a.ack_timeout_us, -1);           /* meshwire's default */
    OK(&c, "node1", "--ack-timeout", "4");
    assert_int_equal(c.a.ack_timeout_us, 4000);
    OK(&c, "node1", "--ack-timeout=0.5");
    assert_int_equal(c.a.ack_timeout_us, 500);
    OK(&c, "node1", "--ack-timeout", "0");              /* rdma_cm's */
    assert_int_equal(c.a.ack_timeout_us, 0);
    OK(&c, "node1", "--ack-timeout", "0.0001");         /* never rounded to 0 */
    assert_int_equal(c.a.ack_timeout_us, 1);

    OK(&c, "node1", "-q");
    assert_int_equal(c.a.verbose, -1);
    OK(&c, "node1", "--quiet");
    assert_int_equal(c.a.verbose, -1);
    OK(&c, "node1", "-vvv");
    assert_int_equal(c.a.verbose, 3);
    OK(&c, "-v", "node1", "-v", "--verbose");
    assert_int_equal(c.a.verbose, 3);
}

static void test_cli_help_version(void **state)
{
    struct cmdline c;
    (void)state;

    assert_int_equal(RUN(&c, "-h"), MC_PARSE_HELP);
    assert_string_equal(c.err, "");
    assert_int_equal(RUN(&c, "--help"), MC_PARSE_HELP);
    assert_int_equal(RUN(&c, "node1", "f", "-h"), MC_PARSE_HELP);
    assert_int_equal(c.a.nto, 0);       /* defaults only */
    assert_int_equal(c.a.window, 8);
    assert_int_equal(RUN(&c, "-V"), MC_PARSE_VERSION);
    assert_int_equal(RUN(&c, "--version"), MC_PARSE_VERSION);
    assert_int_equal(RUN(&c, "-l", "-V"), MC_PARSE_VERSION);
}

/* ------------------------------------------------------------------------
 * Command line: usage errors
 * ------------------------------------------------------------------------ */

static void test_cli_unknown_and_missing(void **state)
{
    (void)state;

    USAGE("'--foo'", "node1", "--foo");
    USAGE("'--foo'", "--foo=bar", "node1");
    USAGE("'-x'", "-x", "node1");
    USAGE("'-x'", "-vx", "node1");
    USAGE("'--forc'", "-l", "--forc");   /* no prefix matching */

    USAGE("'-p'", "node1", "-p");
    USAGE("'--port'", "node1", "--port");
    USAGE("'-t'", "node1", "-t");
    USAGE("'--chunk'", "node1", "--chunk");
    USAGE("'--window'", "node1", "--window");
    USAGE("'--to'", "f", "--to");
    USAGE("'-o'", "-l", "-o");
    USAGE("'--force'", "-l", "--force=yes");
    USAGE("'--quiet'", "node1", "--quiet=1");
}

static void test_cli_bad_numbers(void **state)
{
    struct cmdline c;
    (void)state;

    assert_int_equal(RUN(&c, "node1", "-p", "70000"), MC_PARSE_USAGE);
    assert_string_equal(c.err, "port 70000 out of range (1..65535)");
    USAGE("'abc'", "node1", "-p", "abc");
    USAGE("port 0 out of range", "node1", "-p", "0");
    USAGE("'-1'", "node1", "-p", "-1");
    USAGE("'+80'", "node1", "-p", "+80");
    USAGE("'0x50'", "node1", "-p", "0x50");
    USAGE("''", "node1", "--port=");
    USAGE("99999999999999999999999", "node1", "-p", "99999999999999999999999");
    USAGE("70000", "node1:70000");
    USAGE("'x'", "node1:x");
    USAGE("node1:", "node1:");
    USAGE("65536", "-l", ":65536");
    USAGE("70000", "--to", "a,b:70000");

    USAGE("'0'", "node1", "-t", "0");
    USAGE("'-1'", "node1", "-t", "-1");
    USAGE("'abc'", "node1", "-t", "abc");
    USAGE("'nan'", "node1", "-t", "nan");
    USAGE("'inf'", "node1", "-t", "inf");
    USAGE("'1s'", "node1", "-t", "1s");
    USAGE("''", "node1", "--timeout=");

    USAGE("'4095'", "node1", "--chunk", "4095");
    USAGE("'3K'", "node1", "--chunk", "3K");
    USAGE("'65M'", "node1", "--chunk", "65M");
    USAGE("'1G'", "node1", "--chunk", "1G");
    USAGE("'1.5M'", "node1", "--chunk", "1.5M");
    USAGE("'-4K'", "node1", "--chunk", "-4K");
    USAGE("'K'", "node1", "--chunk", "K");
    USAGE("'99999999999999999999K'", "node1", "--chunk", "99999999999999999999K");
    USAGE("'0'", "node1", "--window", "0");
    USAGE("'65'", "node1", "--window", "65");
    USAGE("'x'", "node1", "--window", "x");
    USAGE("'8 '", "node1", "--window", "8 ");
    USAGE("'-1'", "node1", "--ack-timeout", "-1");
    USAGE("'nan'", "node1", "--ack-timeout", "nan");
    USAGE("'5000000'", "node1", "--ack-timeout", "5000000");
    USAGE("'1ms'", "node1", "--ack-timeout", "1ms");
}

static void test_cli_mode_errors(void **state)
{
    (void)state;

    USAGE("nothing to do");
    USAGE("nothing to do", "-v");
    USAGE("nothing to do", "-p", "9000", "-t", "3");

    USAGE("-o", "-o", "out", "node1", "f");
    USAGE("-o", "--to", "a,b", "--output=x", "f");
    USAGE("-f", "node1", "-f", "f");
    USAGE("-f", "--to", "a", "--force");

    USAGE("'node1'", "node1", "--to", "a,b", "f");
    USAGE("'node1:9000'", "--to", "a,b", "node1:9000", "f");
    USAGE("'[fe80::1]'", "--to", "a", "[fe80::1]", "f");

    USAGE("'node1'", "node1", "-l");
    USAGE("'node1'", "-l", ":9000", "node1");
    USAGE("--to", "-l", "--to", "a,b");
    USAGE("--to", "--to", "a", "-l", ":9000");
    USAGE("'file.bin'", "-l", ":9000", "file.bin");
    USAGE("'f2'", "-l", "-o", "x", "--", "f2");

    USAGE("-q and -v", "-q", "-v", "node1");
    USAGE("-v", "-qv", "node1");

    USAGE("missing host in ':9000'", ":9000", "f");
    USAGE("'a,b'", "a,b", "f");          /* several receivers need --to */
    USAGE("-o/--output", "-l", "-o", "");
}

static void test_cli_directory_names(void **state)
{
    (void)state;
    struct cmdline c;

    OK(&c, "--dir", "redis://10.0.0.1", "-l", "--name", "job/sink/0");
    assert_int_equal(c.a.mode, MC_RECV);
    assert_string_equal(c.a.dir, "redis://10.0.0.1");
    assert_string_equal(c.a.name, "job/sink/0");
    OK(&c, "--dir=unix:/run/r.sock", "job/sink/0", "a.bin", "b.bin");
    assert_int_equal(c.a.mode, MC_SEND);
    assert_string_equal(c.a.name, "job/sink/0");
    assert_int_equal(c.a.nto, 1);
    assert_int_equal(c.a.nfiles, 2);
    OK(&c, "--dir", "redis://h", "node1", "dir/a.bin");    /* a host stays a host */
    assert_null(c.a.name);
    assert_string_equal(c.a.to[0].host, "node1");
    assert_string_equal(c.a.files[0], "dir/a.bin");

    USAGE("--dir URL", "job/sink/0", "a.bin");             /* a name without a directory */
    USAGE("--dir URL", "-l", "--name", "job/sink/0");
    USAGE("--name is for receiving", "--dir", "redis://h", "--name", "a/b", "node1");
    USAGE("has a '/'", "--dir", "redis://h", "-l", "--name", "flat");
    USAGE("empty URL", "--dir", "", "node1");
}

static void test_cli_to_list_errors(void **state)
{
    (void)state;

    USAGE("'a,,b'", "--to", "a,,b", "f");
    USAGE("',a'", "--to", ",a", "f");
    USAGE("'a,'", "--to", "a,", "f");
    USAGE("empty host", "--to", "", "f");
    USAGE("':9000'", "--to", ":9000", "f");
    USAGE("'b'", "--to", "a,b,b");
    USAGE("'a'", "--to", "a:7471,a");   /* same after the default port */
    USAGE("'A'", "--to", "a,A");         /* host names ignore case */
    USAGE("'b:9000'", "-p", "9000", "--to", "b,b:9000");
    USAGE("'a'", "--to", "a", "--to", "a");
    USAGE("'[fe80::1]'", "--to", "fe80::1,[fe80::1]");

    char list[65 * 8];
    size_t n = 0;
    for (int k = 0; k <= MC_MAX_TO; k++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%sh%d", k ? "," : "", k);
    USAGE("64", "--to", list, "f");
}

static void test_cli_duplicate_basenames(void **state)
{
    struct cmdline c;
    (void)state;

    USAGE("'a.bin'", "node1", "x/a.bin", "y/a.bin");
    USAGE("'f'", "--to", "a,b", "d/f", "f");
    USAGE("'f'", "node1", "f", "g", "f");
    USAGE("'c.txt'", "node1", "win\\c.txt", "/tmp/c.txt");
    OK(&c, "node1", "a/x", "a/y", "x.bin");
    assert_int_equal(c.a.nfiles, 3);
    OK(&c, "node1", "only/one");
    assert_int_equal(c.a.nfiles, 1);
}

static void test_cli_err_may_be_null(void **state)
{
    struct mc_args a;
    char *argv[] = {"meshcat", "--bogus", NULL};
    char small[8];
    (void)state;

    assert_int_equal(mc_parse_args(2, argv, &a, NULL, 0), MC_PARSE_USAGE);
    assert_int_equal(mc_parse_args(2, argv, &a, small, sizeof small), MC_PARSE_USAGE);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_int_equal(mc_parse_args(1, argv, &a, NULL, 0), MC_PARSE_USAGE);
}

/* ------------------------------------------------------------------------
 * Endpoints
 * ------------------------------------------------------------------------ */

static void ep_ok(const char *spec, int dport, const char *host, int port)
{
    struct mc_endpoint e;

    if (mc_parse_endpoint(spec, dport, &e) != 0)
        fail_msg("'%s' refused", spec);
    assert_ep(&e, host, port);
}

static void ep_bad(const char *spec, int dport)
{
    struct mc_endpoint e = {.host = "untouched", .port = 42};

    if (mc_parse_endpoint(spec, dport, &e) != -EINVAL)
        fail_msg("'%s' accepted", spec ? spec : "(null)");
    assert_ep(&e, "untouched", 42);
}

static void test_endpoint(void **state)
{
    (void)state;

    ep_ok("host", 7471, "host", 7471);
    ep_ok("host:1", 7471, "host", 1);
    ep_ok("10.0.0.1:65535", 7471, "10.0.0.1", 65535);
    ep_ok(":9000", 7471, "", 9000);
    ep_ok("", 7471, "", 7471);
    ep_ok("[fe80::1]", 7471, "fe80::1", 7471);
    ep_ok("[fe80::1]:9000", 7471, "fe80::1", 9000);
    ep_ok("[fe80::1%eth0]:9000", 7471, "fe80::1%eth0", 9000);
    ep_ok("fe80::1", 7471, "fe80::1", 7471);
    ep_ok("::1", 1, "::1", 1);
    ep_ok("::", 7471, "::", 7471);
    ep_ok("2001:db8::1:9000", 7471, "2001:db8::1:9000", 7471); /* no port w/o [] */
    ep_ok("host:9000", 0, "host", 9000);

    ep_bad(NULL, 7471);
    ep_bad("host", 0);                  /* no port, no default */
    ep_bad("host:", 7471);
    ep_bad("host:0", 7471);
    ep_bad("host:65536", 7471);
    ep_bad("host:+1", 7471);
    ep_bad("host: 1", 7471);
    ep_bad("host:1x", 7471);
    ep_bad(":x", 7471);
    ep_bad("[fe80::1", 7471);
    ep_bad("[]", 7471);
    ep_bad("[]:9000", 7471);
    ep_bad("[fe80::1]x", 7471);
    ep_bad("[fe80::1]:", 7471);
    ep_bad("[::1]:abc", 7471);
    ep_bad("a b", 7471);
    ep_bad("a\tb:1", 7471);
    ep_bad("a/24", 7471);
    ep_bad("a]", 7471);

    char host[MC_HOST_MAX + 8];
    memset(host, 'h', MC_HOST_MAX - 1);
    host[MC_HOST_MAX - 1] = '\0';
    ep_ok(host, 7471, host, 7471);      /* 255 bytes: fits */
    host[MC_HOST_MAX - 1] = 'h';
    host[MC_HOST_MAX] = '\0';
    ep_bad(host, 7471);                 /* 256: does not */
}

/* ------------------------------------------------------------------------
 * Names
 * ------------------------------------------------------------------------ */

static void name_ok(const char *sent, const char *want)
{
    char out[MC_NAME_MAX + 1];

    if (mc_safe_name(sent, out, sizeof out) != 0)
        fail_msg("'%s' refused", sent);
    assert_string_equal(out, want);
}

static void name_bad(const char *sent)
{
    char out[MC_NAME_MAX + 1] = "junk";

    assert_int_equal(mc_safe_name(sent, out, sizeof out), -EINVAL);
    assert_string_equal(out, "");
}

static void test_safe_name(void **state)
{
    (void)state;

    name_ok("x.bin", "x.bin");
    name_ok("../../etc/passwd", "passwd");
    name_ok("/abs/x.bin", "x.bin");
    name_ok("a/b/c", "c");
    name_ok("..\\..\\win.ini", "win.ini");
    name_ok("C:\\tmp\\y", "y");
    name_ok("mixed/dir\\z", "z");
    name_ok("-rf", "-rf");
    name_ok(".hidden", ".hidden");
    name_ok("...", "...");
    name_ok("h\xc3\xa9llo w\xc3\xb6rld", "h\xc3\xa9llo w\xc3\xb6rld");
    name_ok("bad\n/ok", "ok");          /* only the kept part is judged */

    name_bad(NULL);
    name_bad("");
    name_bad(".");
    name_bad("..");
    name_bad("a/..");
    name_bad("a/.");
    name_bad("..\\..");
    name_bad("dir/");
    name_bad("/");
    name_bad("a\nb");
    name_bad("tab\there");
    name_bad("x\x7f");
    name_bad("\x1b[31mred");
    name_bad("\x01");
}

static void test_safe_name_lengths(void **state)
{
    char sent[600], out[600];
    (void)state;

    memset(sent, 'n', 255);
    sent[255] = '\0';
    assert_int_equal(mc_safe_name(sent, out, sizeof out), 0);
    assert_int_equal(strlen(out), 255);
    sent[255] = 'n';
    sent[256] = '\0';
    assert_int_equal(mc_safe_name(sent, out, sizeof out), -EINVAL);

    /* long directories are dropped, so only the component counts */
    memset(sent, 'd', 400);
    sent[400] = '/';
    sent[401] = 'f';
    sent[402] = '\0';
    name_ok(sent, "f");

    assert_int_equal(mc_safe_name("abc", out, 4), 0);
    assert_string_equal(out, "abc");
    assert_int_equal(mc_safe_name("abc", out, 3), -ENAMETOOLONG);
    assert_string_equal(out, "");
    assert_int_equal(mc_safe_name("abc", NULL, 0), -ENAMETOOLONG);
}

static void test_partial_name(void **state)
{
    char out[600], name[300];
    (void)state;

    assert_int_equal(mc_partial_name("x.bin", out, sizeof out), 0);
    assert_string_equal(out, ".x.bin.meshcat-part");
    assert_int_equal(mc_partial_name(".h", out, sizeof out), 0);
    assert_string_equal(out, "..h.meshcat-part");

    /* 1 + n + 13 <= 255 */
    memset(name, 'n', 241);
    name[241] = '\0';
    assert_int_equal(mc_partial_name(name, out, sizeof out), 0);
    assert_int_equal(strlen(out), 255);
    name[241] = 'n';
    name[242] = '\0';
    assert_int_equal(mc_partial_name(name, out, sizeof out), -ENAMETOOLONG);
    assert_string_equal(out, "");

    assert_int_equal(mc_partial_name("ab", out, 17), 0);   /* 16 + NUL */
    assert_string_equal(out, ".ab.meshcat-part");
    assert_int_equal(mc_partial_name("ab", out, 16), -ENAMETOOLONG);

    assert_int_equal(mc_partial_name("", out, sizeof out), -EINVAL);
    assert_int_equal(mc_partial_name(NULL, out, sizeof out), -EINVAL);
    assert_int_equal(mc_partial_name("a/b", out, sizeof out), -EINVAL);
    assert_int_equal(mc_partial_name("a\\b", out, sizeof out), -EINVAL);
}

/* ------------------------------------------------------------------------
 * Temporaries and publishing (mc_part_open, mc_part_publish)
 * ------------------------------------------------------------------------ */

/* names.c's calls land here (this executable defines them): a test can make
 * the random suffix constant, or have RENAME_NOREPLACE refused as some file
 * systems do. */
static bool fixed_random, noreplace_einval;
static int noreplace_refused;     /* times the flag was refused */

ssize_t getrandom(void *buf, size_t len, unsigned int flags)
{
    if (fixed_random) {
        memset(buf, 0x5a, len);
        return (ssize_t)len;
    }
    return syscall(SYS_getrandom, buf, len, flags);
}

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
              unsigned int flags)
{
    if (noreplace_einval && (flags & RENAME_NOREPLACE)) {
        noreplace_refused++;
        errno = EINVAL;
        return -1;
    }
    return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

struct tdir {
    char path[64];
    int fd;
};

static void tdir_make(struct tdir *d)
{
    snprintf(d->path, sizeof d->path, "/tmp/meshcat-unit.XXXXXX");
    assert_non_null(mkdtemp(d->path));
    d->fd = open(d->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(d->fd >= 0);
}

/* Entries in @d (not . and ..); the first one's name into @first. */
static int tdir_count(struct tdir *d, char *first, size_t cap)
{
    DIR *dir = opendir(d->path);
    struct dirent *e;
    int n = 0;

    assert_non_null(dir);
    while ((e = readdir(dir)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && n++ == 0 && first)
            snprintf(first, cap, "%s", e->d_name);
    closedir(dir);
    return n;
}

static void tdir_remove(struct tdir *d)
{
    DIR *dir = opendir(d->path);
    struct dirent *e;

    assert_non_null(dir);
    while ((e = readdir(dir)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            assert_int_equal(unlinkat(d->fd, e->d_name, 0), 0);
    closedir(dir);
    close(d->fd);
    assert_int_equal(rmdir(d->path), 0);
}

static void put(int dirfd, const char *name, const char *text)
{
    int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void content_is(int dirfd, const char *name, const char *want)
{
    char buf[256];
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    assert_true(n >= 0);
    buf[n] = '\0';
    assert_string_equal(buf, want);
}

/* A temporary for @final holding @text; its name into @part. */
static int temp_with(struct tdir *d, const char *final, const char *text, char *part)
{
    int fd = mc_part_open(d->fd, final, 0644, part, MC_NAME_MAX + 1);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    return fd;
}

static void test_part_open(void **state)
{
    enum { N = 200 };
    static char parts[N][MC_NAME_MAX + 1];
    int fds[N];
    struct stat st[N];
    struct tdir d;
    char part[MC_NAME_MAX + 1], name[MC_NAME_MAX + 1];
    (void)state;

    tdir_make(&d);
    /* many temporaries for one name in one directory: all distinct files */
    for (int i = 0; i < N; i++) {
        fds[i] = mc_part_open(d.fd, "x.bin", 0644, parts[i], sizeof parts[i]);
        assert_true(fds[i] >= 0);
        assert_int_equal(strlen(parts[i]), strlen(".x.bin.meshcat-part.") + 6);
        assert_memory_equal(parts[i], ".x.bin.meshcat-part.", strlen(".x.bin.meshcat-part."));
        assert_int_equal(fstat(fds[i], &st[i]), 0);
        for (int j = 0; j < i; j++) {
            assert_string_not_equal(parts[i], parts[j]);
            assert_true(st[i].st_ino != st[j].st_ino);
        }
    }
    assert_int_equal(tdir_count(&d, NULL, 0), N);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    tdir_remove(&d);

    /* the mode, under the umask */
    tdir_make(&d);
    mode_t old = umask(022);
    int fd = mc_part_open(d.fd, "m", 0664, part, sizeof part);
    umask(old);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st[0]), 0);
    assert_int_equal(st[0].st_mode & 0777, 0644);
    close(fd);

    /* the longest name still gets one, cut short */
    memset(name, 'n', MC_NAME_MAX);
    name[MC_NAME_MAX] = '\0';
    fd = mc_part_open(d.fd, name, 0644, part, sizeof part);
    assert_true(fd >= 0);
    assert_true(strlen(part) <= MC_NAME_MAX);
    assert_memory_equal(part, ".nnn", 4);
    assert_non_null(strstr(part, ".meshcat-part."));
    close(fd);
    assert_int_equal(tdir_count(&d, NULL, 0), 2);

    assert_int_equal(mc_part_open(d.fd, "", 0644, part, sizeof part), -EINVAL);
    assert_string_equal(part, "");
    assert_int_equal(mc_part_open(d.fd, NULL, 0644, part, sizeof part), -EINVAL);
    assert_int_equal(mc_part_open(d.fd, "a/b", 0644, part, sizeof part), -EINVAL);
    assert_int_equal(mc_part_open(d.fd, "ab", 0644, part, 16), -ENAMETOOLONG);
    assert_int_equal(mc_part_open(-1, "ab", 0644, part, sizeof part), -EBADF);
    assert_string_equal(part, "");
    assert_int_equal(tdir_count(&d, NULL, 0), 2);
    tdir_remove(&d);
}

/* A name already taken is retried with another suffix, not truncated. */
static void test_part_open_taken(void **state)
{
    struct tdir d, e;
    char a[MC_NAME_MAX + 1], b[MC_NAME_MAX + 1], c[MC_NAME_MAX + 1];
    (void)state;

    tdir_make(&d);
    tdir_make(&e);
    fixed_random = true;          /* every call draws the same suffix first */
    int fa = temp_with(&d, "x", "first", a);
    int fb = temp_with(&d, "x", "second", b);
    int fc = temp_with(&e, "x", "elsewhere", c);
    fixed_random = false;
    assert_string_equal(a, c);    /* the suffix was the fixed one */
    assert_string_not_equal(a, b);
    close(fa);
    close(fb);
    close(fc);
    content_is(d.fd, a, "first");
    content_is(d.fd, b, "second");
    tdir_remove(&d);
    tdir_remove(&e);
}

static void publish_cases(void)
{
    struct tdir d;
    char part[MC_NAME_MAX + 1], first[MC_NAME_MAX + 1];

    /* published: the content under the final name, nothing else */
    tdir_make(&d);
    int fd = temp_with(&d, "x", "new", part);
    assert_int_equal(mc_part_publish(d.fd, fd, part, "x", false), 0);
    content_is(d.fd, "x", "new");
    assert_int_equal(tdir_count(&d, first, sizeof first), 1);
    assert_string_equal(first, "x");

    /* a file created at the final name after the receiver checked: kept,
     * and the temporary is gone */
    fd = temp_with(&d, "y", "new", part);
    put(d.fd, "y", "old");
    assert_int_equal(mc_part_publish(d.fd, fd, part, "y", false), -EEXIST);
    content_is(d.fd, "y", "old");
    assert_int_equal(faccessat(d.fd, part, F_OK, 0), -1);
    assert_int_equal(tdir_count(&d, NULL, 0), 2);

    /* a dangling symlink counts as a file there */
    fd = temp_with(&d, "z", "new", part);
    assert_int_equal(symlinkat("nowhere", d.fd, "z"), 0);
    assert_int_equal(mc_part_publish(d.fd, fd, part, "z", false), -EEXIST);
    assert_int_equal(faccessat(d.fd, part, F_OK, 0), -1);
    assert_int_equal(faccessat(d.fd, "nowhere", F_OK, 0), -1);
    assert_int_equal(tdir_count(&d, NULL, 0), 3);

    /* -f replaces */
    fd = temp_with(&d, "y", "newer", part);
    assert_int_equal(mc_part_publish(d.fd, fd, part, "y", true), 0);
    content_is(d.fd, "y", "newer");
    assert_int_equal(tdir_count(&d, NULL, 0), 3);

    /* a failure before the rename (a bad descriptor): the temporary goes */
    fd = temp_with(&d, "w", "new", part);
    close(fd);
    assert_int_equal(mc_part_publish(d.fd, fd, part, "w", false), -EBADF);
    assert_int_equal(faccessat(d.fd, "w", F_OK, 0), -1);
    assert_int_equal(tdir_count(&d, NULL, 0), 3);
    tdir_remove(&d);
}

static void test_part_publish(void **state)
{
    (void)state;
    publish_cases();
}

/* The same where the file system refuses RENAME_NOREPLACE: link + unlink. */
static void test_part_publish_no_noreplace(void **state)
{
    (void)state;
    noreplace_einval = true;
    publish_cases();
    noreplace_einval = false;
    assert_int_equal(noreplace_refused, 3);   /* every publish without -f */
}

/* ------------------------------------------------------------------------
 * Bytes and durations
 * ------------------------------------------------------------------------ */

static void bytes_is(uint64_t b, const char *want)
{
    char out[MC_BYTES_LEN];

    mc_fmt_bytes(b, out, sizeof out);
    if (strcmp(out, want) != 0)
        fail_msg("%llu bytes: '%s', want '%s'", (unsigned long long)b, out, want);
}

static void test_fmt_bytes(void **state)
{
    const uint64_t Ki = 1024, Mi = Ki * Ki, Gi = Mi * Ki, Ti = Gi * Ki, Ei = Ti * Ki * Ki;
    (void)state;

    bytes_is(0, "0 B");
    bytes_is(1, "1 B");
    bytes_is(1023, "1023 B");
    bytes_is(Ki, "1.0 KiB");
    bytes_is(1536, "1.5 KiB");
    bytes_is(1023 * Ki + 900, "1023.9 KiB");
    bytes_is(Mi - 1, "1.0 MiB");        /* 1023.999 KiB would print as 1024.0 */
    bytes_is(Mi, "1.0 MiB");
    bytes_is(135 * Mi, "135.0 MiB");
    bytes_is(300 * Mi, "300.0 MiB");
    bytes_is(1023 * Mi, "1023.0 MiB");
    bytes_is(Gi - 1, "1.00 GiB");
    bytes_is(Gi, "1.00 GiB");
    bytes_is(Gi + Gi / 2, "1.50 GiB");
    bytes_is(Ti, "1.00 TiB");
    bytes_is(Ti - 1, "1.00 TiB");
    bytes_is(Ei, "1.00 EiB");
    bytes_is(UINT64_MAX, "16.00 EiB");

    /* always under 16 characters, near every unit boundary */
    char out[64];
    for (int shift = 0; shift < 64; shift++)
        for (int64_t d = -3; d <= 3; d++) {
            uint64_t v = ((uint64_t)1 << shift) + (uint64_t)d;
            mc_fmt_bytes(v, out, sizeof out);
            assert_true(strlen(out) < MC_BYTES_LEN);
            mc_fmt_bytes(v * 1000, out, sizeof out);
            assert_true(strlen(out) < MC_BYTES_LEN);
        }
    char tiny[4];
    mc_fmt_bytes(Ki, tiny, sizeof tiny);
    assert_string_equal(tiny, "1.0");
}

static void dur_is(double s, const char *want)
{
    char out[32];

    mc_fmt_duration(s, out, sizeof out);
    if (strcmp(out, want) != 0)
        fail_msg("%g s: '%s', want '%s'", s, out, want);
}

static void test_fmt_duration(void **state)
{
    (void)state;

    dur_is(0, "0:00");
    dur_is(7, "0:07");
    dur_is(7.4, "0:07");
    dur_is(7.5, "0:08");
    dur_is(59, "0:59");
    dur_is(59.6, "1:00");
    dur_is(60, "1:00");
    dur_is(754, "12:34");
    dur_is(3599, "59:59");
    dur_is(3600, "1:00:00");
    dur_is(3723, "1:02:03");
    dur_is(360000, "100:00:00");
    dur_is(-1, "--:--");
    dur_is(-0.001, "--:--");
    dur_is(NAN, "--:--");
    dur_is(INFINITY, "--:--");
    dur_is(-INFINITY, "--:--");
    dur_is(1e30, "--:--");
}

/* ------------------------------------------------------------------------
 * Rate
 * ------------------------------------------------------------------------ */

static void test_rate_constant(void **state)
{
    struct mc_rate r;
    uint64_t bytes = 0;
    (void)state;

    mc_rate_init(&r, 100.0);
    assert_true(mc_rate_get(&r) == 0.0);
    for (int k = 1; k <= 300; k++) {
        bytes += 10000000;              /* 100 MB/s in 0.1 s steps */
        mc_rate_update(&r, 100.0 + k * 0.1, bytes);
        assert_true(fabs(mc_rate_get(&r) - 1e8) < 1e8 * 1e-6);
    }
}

static void test_rate_step_response(void **state)
{
    struct mc_rate r;
    uint64_t bytes = 0;
    double t = 0;
    (void)state;

    mc_rate_init(&r, 0);
    for (int k = 0; k < 300; k++) {
        t += 0.1;
        bytes += 10000000;              /* 100 MB/s for 30 s */
        mc_rate_update(&r, t, bytes);
    }
    for (int k = 0; k < 20; k++) {      /* then 50 MB/s, for one time constant */
        t += 0.1;
        bytes += 5000000;
        mc_rate_update(&r, t, bytes);
    }
    double one_tau = mc_rate_get(&r);
    assert_true(one_tau > 60e6 && one_tau < 80e6);  /* ~1/e of the way left */
    for (int k = 0; k < 100; k++) {
        t += 0.1;
        bytes += 5000000;
        mc_rate_update(&r, t, bytes);
    }
    assert_true(fabs(mc_rate_get(&r) - 50e6) < 50e6 * 0.01);
}

/* 1 MiB chunks every 10 ms, sampled every 1 ms: most samples see nothing. */
static void test_rate_bursty(void **state)
{
    struct mc_rate r;
    uint64_t bytes = 0;
    const double want = 1048576 / 0.01;
    (void)state;

    mc_rate_init(&r, 0);
    for (int k = 1; k <= 30000; k++) {
        if (k % 10 == 0)
            bytes += 1048576;
        mc_rate_update(&r, k * 0.001, bytes);
        if (k > 10000)
            assert_true(fabs(mc_rate_get(&r) - want) < want * 0.02);
    }
}

static void test_rate_dt_zero(void **state)
{
    struct mc_rate r;
    (void)state;

    mc_rate_init(&r, 5.0);
    mc_rate_update(&r, 5.0, 1000);      /* no time yet: nothing to say */
    assert_true(mc_rate_get(&r) == 0.0);
    mc_rate_update(&r, 6.0, 1000000);
    assert_true(mc_rate_get(&r) == 1000000.0);
    mc_rate_update(&r, 6.0, 3000000);   /* dt == 0 twice */
    mc_rate_update(&r, 6.0, 5000000);
    assert_true(isfinite(mc_rate_get(&r)));
    assert_true(mc_rate_get(&r) == 1000000.0);
    mc_rate_update(&r, 7.0, 5000000);   /* the bytes above count now */
    assert_true(mc_rate_get(&r) == 2500000.0);
    mc_rate_update(&r, 6.5, 9000000);   /* time going backwards: ignored */
    mc_rate_update(&r, 7.5, 1);         /* bytes going backwards: ignored */
    mc_rate_update(&r, NAN, 9000000);
    assert_true(mc_rate_get(&r) == 2500000.0);

    /* primed too: a burst of same-time updates, then steady again */
    double t = 7.0;
    uint64_t b = 5000000;
    for (int k = 0; k < 100; k++) {
        t += 0.1;
        b += 1000000;
        mc_rate_update(&r, t, b);
        mc_rate_update(&r, t, b);
        assert_true(isfinite(mc_rate_get(&r)));
    }
    assert_true(fabs(mc_rate_get(&r) - 10e6) < 10e6 * 0.01);
}

/* ------------------------------------------------------------------------
 * Progress line
 * ------------------------------------------------------------------------ */

#define MiB (1024.0 * 1024.0)

static void line_is(uint64_t done, uint64_t total, double rate, int width, const char *want)
{
    char out[512];
    size_t n = mc_progress_line(out, sizeof out, done, total, rate, width);

    if (strcmp(out, want) != 0)
        fail_msg("width %d: '%s', want '%s'", width, out, want);
    assert_int_equal(n, strlen(want));
}

static void test_progress_forms(void **state)
{
    const uint64_t M = (uint64_t)1 << 20;
    (void)state;

    line_is(135 * M, 300 * M, 68.2 * MiB, 80,
            "[########>           ]  45%  135.0 MiB / 300.0 MiB  68.2 MiB/s  ETA 0:02");
    line_is(135 * M, 300 * M, 68.2 * MiB, 200,
            "[########>           ]  45%  135.0 MiB / 300.0 MiB  68.2 MiB/s  ETA 0:02");
    /* a narrower bar, then none */
    line_is(135 * M, 300 * M, 68.2 * MiB, 62,
            "[###>      ]  45%  135.0 MiB / 300.0 MiB  68.2 MiB/s  ETA 0:02");
    line_is(135 * M, 300 * M, 68.2 * MiB, 61,
            " 45%  135.0 MiB / 300.0 MiB  68.2 MiB/s  ETA 0:02");
    line_is(135 * M, 300 * M, 68.2 * MiB, 48,
            " 45%  135.0 MiB / 300.0 MiB  ETA 0:02");
    line_is(135 * M, 300 * M, 68.2 * MiB, 36,
            " 45%  ETA 0:02");
    line_is(135 * M, 300 * M, 68.2 * MiB, 13, " 45%");
    line_is(135 * M, 300 * M, 68.2 * MiB, 3, "45%");
    line_is(135 * M, 300 * M, 68.2 * MiB, 2, "");
    line_is(135 * M, 300 * M, 68.2 * MiB, 0, "");
    line_is(135 * M, 300 * M, 68.2 * MiB, -5, "");

    /* unknown total */
    line_is(135 * M, 0, 68.2 * MiB, 80, "135.0 MiB  68.2 MiB/s");
    line_is(135 * M, 0, 68.2 * MiB, 20, "135.0 MiB");
    line_is(135 * M, 0, 68.2 * MiB, 8, "");

    /* rate 0 or nonsense: no ETA */
    line_is(0, 1000, 0, 80, "[                    ]   0%  0 B / 1000 B  0 B/s  ETA --:--");
    line_is(10, 1000, NAN, 16, "  1%  ETA --:--");
    line_is(10, 1000, -5, 16, "  1%  ETA --:--");
    /* done: full bar, 100%, ETA 0 */
    line_is(1000, 1000, 0, 80,
            "[####################] 100%  1000 B / 1000 B  0 B/s  ETA 0:00");
    line_is(999, 1000, 100, 6, " 99%");  /* 99.9% is not 100% */
    line_is(2000, 1000, 100, 6, "100%"); /* more than announced: clamped */
}

static void test_progress_never_too_wide(void **state)
{
    const uint64_t cases[][2] = {
        {0, 1}, {1, 2}, {135u << 20, 300u << 20}, {999, 1000}, {5, 5},
        {UINT64_MAX - 1, UINT64_MAX}, {123456789, 0}, {0, 0}, {UINT64_MAX, 0},
        {1, UINT64_MAX},
    };
    const double rates[] = {0, 1, 68.2 * MiB, 1e30, NAN, -1, INFINITY};
    char out[512];
    (void)state;

    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++)
            for (int w = 1; w <= 200; w++) {
                memset(out, 'Z', sizeof out);
                size_t n = mc_progress_line(out, sizeof out, cases[c][0], cases[c][1],
                                            rates[r], w);
                assert_int_equal(n, strlen(out));
                if (n > (size_t)w)
                    fail_msg("width %d: '%s' (%zu)", w, out, n);
                assert_null(strpbrk(out, "\r\n\x1b"));
                if (cases[c][1] && w >= 4)
                    assert_non_null(strchr(out, '%'));
                if (!cases[c][1] && w >= 16)
                    assert_true(n > 0);
                if (!cases[c][1])
                    assert_null(strstr(out, "ETA"));
            }
}

static void test_progress_small_cap(void **state)
{
    char out[10];
    (void)state;

    size_t n = mc_progress_line(out, sizeof out, 5, 10, 1, 80);
    assert_int_equal(n, 9);
    assert_int_equal(strlen(out), 9);
    assert_int_equal(mc_progress_line(out, 0, 5, 10, 1, 80), 0);
}

/* ------------------------------------------------------------------------
 * Summary line
 * ------------------------------------------------------------------------ */

static void test_summary(void **state)
{
    char out[256];
    size_t n;
    (void)state;

    n = mc_summary_line(out, sizeof out, 314572800, 4.52, "rxe0 198.19.1.1", "198.19.1.2:7471");
    assert_string_equal(out, "314572800 bytes in 4.52 s, 69.6 MB/s "
                             "(local rxe0 198.19.1.1 -> remote 198.19.1.2:7471)");
    assert_int_equal(n, strlen(out));

    mc_summary_line(out, sizeof out, 1000000, 1.0, NULL, "10.0.0.2:7471");
    assert_string_equal(out, "1000000 bytes in 1.00 s, 1.0 MB/s (remote 10.0.0.2:7471)");
    mc_summary_line(out, sizeof out, 1000000, 2.0, "mlx5_0 10.0.0.1", NULL);
    assert_string_equal(out, "1000000 bytes in 2.00 s, 0.5 MB/s (local mlx5_0 10.0.0.1)");
    mc_summary_line(out, sizeof out, 0, 0.25, NULL, "");
    assert_string_equal(out, "0 bytes in 0.25 s, 0.0 MB/s");

    mc_summary_line(out, sizeof out, 42, 0, NULL, NULL);
    assert_string_equal(out, "42 bytes in 0.00 s, - MB/s");
    mc_summary_line(out, sizeof out, 42, -1, NULL, NULL);
    assert_string_equal(out, "42 bytes in 0.00 s, - MB/s");
    mc_summary_line(out, sizeof out, 42, NAN, NULL, NULL);
    assert_string_equal(out, "42 bytes in 0.00 s, - MB/s");
    mc_summary_line(out, sizeof out, UINT64_MAX, 1e-300, NULL, NULL);
    assert_true(strlen(out) < 80);

    n = mc_summary_line(out, 11, 314572800, 4.52, NULL, NULL);
    assert_string_equal(out, "314572800 ");
    assert_int_equal(n, 10);
}

/* ------------------------------------------------------------------------
 * Help text
 * ------------------------------------------------------------------------ */

static void test_usage_text(void **state)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    const char *must[] = {
        "-l", "--listen", "--to", "-p, --port", "-o, --output", "-f, --force",
        "-q, --quiet", "-v, --verbose", "-t, --timeout", "--chunk", "--window",
        "-h, --help", "-V, --version", "default 7471", "default 10", "default 1M",
        "default 8", "4K..64M", "1..64", "0  success", "1  transfer failure",
        "2  usage error", "meshcat --to ",
    };
    (void)state;

    assert_non_null(f);
    mc_usage(f);
    mc_version(f);
    fclose(f);
    for (size_t k = 0; k < sizeof must / sizeof must[0]; k++)
        if (!strstr(text, must[k]))
            fail_msg("usage lacks '%s'", must[k]);
    assert_non_null(strstr(text, "\nmeshcat "));  /* the version line */
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_recv_forms),
        cmocka_unit_test(test_cli_send_forms),
        cmocka_unit_test(test_cli_permutes_argv),
        cmocka_unit_test(test_cli_fanout_forms),
        cmocka_unit_test(test_cli_options),
        cmocka_unit_test(test_cli_help_version),
        cmocka_unit_test(test_cli_unknown_and_missing),
        cmocka_unit_test(test_cli_bad_numbers),
        cmocka_unit_test(test_cli_mode_errors),
        cmocka_unit_test(test_cli_directory_names),
        cmocka_unit_test(test_cli_to_list_errors),
        cmocka_unit_test(test_cli_duplicate_basenames),
        cmocka_unit_test(test_cli_err_may_be_null),
        cmocka_unit_test(test_endpoint),
        cmocka_unit_test(test_safe_name),
        cmocka_unit_test(test_safe_name_lengths),
        cmocka_unit_test(test_partial_name),
        cmocka_unit_test(test_part_open),
        cmocka_unit_test(test_part_open_taken),
        cmocka_unit_test(test_part_publish),
        cmocka_unit_test(test_part_publish_no_noreplace),
        cmocka_unit_test(test_fmt_bytes),
        cmocka_unit_test(test_fmt_duration),
        cmocka_unit_test(test_rate_constant),
        cmocka_unit_test(test_rate_step_response),
        cmocka_unit_test(test_rate_bursty),
        cmocka_unit_test(test_rate_dt_zero),
        cmocka_unit_test(test_progress_forms),
        cmocka_unit_test(test_progress_never_too_wide),
        cmocka_unit_test(test_progress_small_cap),
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_usage_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
