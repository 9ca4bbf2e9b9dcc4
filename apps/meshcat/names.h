/* meshcat: the receiver's file names.
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
 * Pure functions, no state; safe from any thread.
 */
#ifndef MESHCAT_NAMES_H
#define MESHCAT_NAMES_H

#include <stddef.h>

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

#endif
