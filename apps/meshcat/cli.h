/* meshcat: command line.
 *
 *   meshcat -l [ADDR][:PORT] [-o PATH] [-f]              receive
 *   meshcat [opts] HOST[:PORT] [FILE...]                 send (no FILE: stdin)
 *   meshcat [opts] --to HOST[:PORT],HOST[:PORT],... [FILE...]    fan-out
 *   meshcat --dir URL -l --name NAME / meshcat --dir URL NAME [FILE...]
 *
 * Parsing only: nothing here opens files, resolves names or prints, except
 * mc_usage() and mc_version() which print what they are asked to.  No global
 * state; safe from any thread on distinct arguments.
 */
#ifndef MESHCAT_CLI_H
#define MESHCAT_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MC_DEFAULT_PORT 7471
#define MC_DEFAULT_TIMEOUT_S 10.0
#define MC_DEFAULT_CHUNK ((size_t)1 << 20)  /* 1 MiB */
#define MC_CHUNK_MIN ((size_t)4 << 10)      /* 4 KiB */
#define MC_CHUNK_MAX ((size_t)64 << 20)     /* 64 MiB */
#define MC_DEFAULT_WINDOW 8u
#define MC_WINDOW_MAX 64u
#define MC_MAX_TO 64          /* receivers in one --to fan-out */
#define MC_HOST_MAX 256       /* sizeof mc_endpoint.host, NUL included */

/* Exit statuses, as documented by mc_usage(). */
#define MC_EXIT_OK 0
#define MC_EXIT_FAIL 1        /* the transfer failed */
#define MC_EXIT_USAGE 2       /* bad command line */

/** An address and port; @host has no brackets, "" means all local addresses. */
struct mc_endpoint {
    char host[MC_HOST_MAX];
    int port;
};

enum mc_mode { MC_RECV, MC_SEND };

/** The parsed command line; see mc_parse_args(). */
struct mc_args {
    enum mc_mode mode;
    struct mc_endpoint listen;      /* MC_RECV: where to listen */
    struct mc_endpoint to[MC_MAX_TO]; /* MC_SEND: the receivers, in order */
    int nto;                        /* MC_SEND: >= 1 */
    const char *output;             /* MC_RECV: -o PATH (points into argv), or NULL;
                                       file or directory is the caller's call */
    bool force;                     /* MC_RECV: -f, overwrite existing files */
    int verbose;                    /* -1 quiet (-q), 0 normal, >0 each -v */
    bool progress;                  /* -P: progress line even without a tty */
    double timeout_s;               /* > 0, finite */
    size_t chunk;                   /* MC_CHUNK_MIN..MC_CHUNK_MAX */
    unsigned window;                /* 1..MC_WINDOW_MAX */
    int64_t ack_timeout_us;         /* --ack-timeout; -1: meshwire's default */
    const char *dir;                /* --dir URL: a meshwire directory, or NULL */
    const char *name;               /* MC_RECV: --name, published in it; MC_SEND:
                                       the HOST operand when it is a directory
                                       name (has a '/'); else NULL */
    char **files;                   /* MC_SEND: argv's FILE arguments, in order;
                                       NULL when nfiles is 0 (send stdin) */
    int nfiles;
};

enum mc_parse_result {
    MC_PARSE_OK = 0,
    MC_PARSE_HELP,      /* -h/--help: print mc_usage(stdout), exit 0 */
    MC_PARSE_VERSION,   /* -V/--version: print mc_version(stdout), exit 0 */
    MC_PARSE_USAGE,     /* bad command line: print err, exit MC_EXIT_USAGE */
};

/**
 * mc_parse_args() - parse meshcat's command line.
 * @argc, @argv: as given to main().  Options and operands may be mixed
 *        ("meshcat host f.bin -v"); like GNU getopt, @argv is permuted in
 *        place so the operands end up last, in their original order (the
 *        strings themselves are neither copied nor changed).  "--" ends the
 *        options.  Long options take "--opt=value" or "--opt value", short
 *        ones "-p 9000" or "-p9000"; flags cluster ("-vv", "-fq").
 *        -l takes an optional [ADDR][:PORT]: the next element, if there is
 *        one and it does not start with '-'.
 *        With --to, a first FILE that looks like HOST:PORT (no '/', ends in
 *        ":digits", or "[v6]...") is taken for a stray HOST and refused:
 *        write such a file as ./NAME.
 * @a:    receives the result; defaults for what is not given.  On
 *        MC_PARSE_HELP and MC_PARSE_VERSION it holds only defaults, on
 *        MC_PARSE_USAGE its content is unspecified.  Pointers in it point
 *        into @argv, which must outlive it.
 * @err, @errcap: on MC_PARSE_USAGE, a one-line reason without newline naming
 *        the culprit, e.g. "unknown option '--foo'", "port 70000 out of range
 *        (1..65535)"; "" otherwise.  May be NULL/0.
 * Return: an enum mc_parse_result.
 */
enum mc_parse_result mc_parse_args(int argc, char **argv, struct mc_args *a, char *err,
                                   size_t errcap);

/**
 * mc_parse_endpoint() - parse "host", "host:port", ":port", "" , "[v6]",
 * "[v6]:port", or a bare IPv6 address (more than one ':', so no port).
 * @spec: the text.
 * @default_port: the port when @spec has none; 0 makes a port mandatory.
 * @out:  receives host (brackets removed, "" when @spec has none) and port;
 *        written only on success.
 * Hosts with spaces, control bytes, '/', '[' or ']', or of MC_HOST_MAX bytes
 * or more are refused; ports must be 1..65535 in plain decimal.
 * Return: 0 or -EINVAL.
 */
int mc_parse_endpoint(const char *spec, int default_port, struct mc_endpoint *out);

/**
 * mc_usage() - write the full --help text to @f: synopsis, every option with
 * its default, exit statuses, examples.
 */
void mc_usage(FILE *f);

/** mc_version() - write "meshcat VERSION\n" to @f. */
void mc_version(FILE *f);

#endif
