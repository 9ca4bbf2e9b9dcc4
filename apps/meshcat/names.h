/* meshcat: the receiver's file names, and how a received file gets one.
 *
 * The sender announces a name; the receiver must never write outside its
 * target directory whatever that name says.  The rule (mc_safe_name()):
 *
 *   1. keep only the last path component: everything up to the last '/' or
 *      '\\' is dropped (so "../../etc/passwd" -> "passwd", "/abs/x.bin" ->
 *      "x.bin", "C:\\tmp\\y" -> "y");
 *   2. refuse what is left if it is empty, "." or "..", longer than 255 bytes
 *      (NAME_MAX), or holds a control byte (< 0x20 or 0x7f).
 *
 * Leading '-' and dots are allowed: the name is only ever used as a path
 * component under the target directory, never as a command argument.
 *
 * A file is written to a temporary of its own in the target directory
 * (mc_part_open()) and given its name only once verified (mc_part_publish()),
 * so receivers sharing a directory never write to one file, and an existing
 * file is never replaced unless asked.
 * No state; safe from any thread.
 */
#ifndef MESHCAT_NAMES_H
#define MESHCAT_NAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define MC_NAME_MAX 255 /* bytes in one path component (Linux NAME_MAX) */

/**
 * mc_safe_name() - the single safe path component for a name a peer sent.
 * @sent: the announced name (untrusted, NUL-terminated).
 * @out:  receives the component, NUL-terminated; set to "" on any error
 *        (when @cap > 0), so a caller that ignores the return cannot use a
 *        half-checked name.
 * @cap:  size of @out.
 * Return: 0; -EINVAL if @sent is NULL or the rule above refuses it;
 *         -ENAMETOOLONG if the component does not fit in @cap.
 */
int mc_safe_name(const char *sent, char *out, size_t cap);

/**
 * mc_partial_name() - the name written to until the data is verified.
 * @final_name: a component from mc_safe_name().
 * @out, @cap:  receive ".<final_name>.meshcat-part": hidden, and plainly
 *              incomplete to anyone listing the directory.
 * Return: 0; -EINVAL if @final_name is NULL, empty or holds a separator;
 *         -ENAMETOOLONG if the result exceeds MC_NAME_MAX bytes or @cap.
 */
int mc_partial_name(const char *final_name, char *out, size_t cap);

/**
 * mc_part_open() - create the temporary a file is written to until verified.
 * @dirfd:      the target directory (or AT_FDCWD).
 * @final_name: a component from mc_safe_name().
 * @mode:       as for open(2) (the umask applies).
 * @part, @cap: receive the temporary's name in @dirfd: mc_partial_name() of
 *              @final_name (cut short if needed to leave room) then "." and
 *              6 random letters or digits, e.g. ".x.bin.meshcat-part.q3ZkT0".
 *              Set to "" on any error.
 * The file is created with O_EXCL (and O_NOFOLLOW, O_CLOEXEC); a name already
 * taken is retried with another suffix, so two temporaries never collide.
 * Return: a descriptor open for writing; -EINVAL if @final_name is NULL, empty
 *         or holds a separator; -ENAMETOOLONG if @cap is too small; else
 *         openat()'s negative errno.
 */
int mc_part_open(int dirfd, const char *final_name, mode_t mode, char *part, size_t cap);

/**
 * mc_part_publish() - give a verified temporary its final name.
 * @dirfd:      the directory of both names.
 * @fd:         the temporary, from mc_part_open(); closed in all cases.
 * @part:       its name in @dirfd.
 * @final_name: the name to give it.
 * @replace:    replace a file already at @final_name (meshcat -f).
 * Syncs @fd, renames @part to @final_name -- without @replace never over an
 * existing file, checked atomically by the rename itself (RENAME_NOREPLACE, or
 * link() then unlink() where the file system refuses that flag) -- then syncs
 * @dirfd so the new name survives a crash.
 * Return: 0; -EEXIST if @final_name exists and not @replace; else the
 *         negative errno of the step that failed.  On failure @part is
 *         removed; @final_name is untouched unless only the last step failed
 *         (syncing @dirfd, or removing @part after the link), when the file
 *         is in place already.
 */
int mc_part_publish(int dirfd, int fd, const char *part, const char *final_name, bool replace);

#endif
