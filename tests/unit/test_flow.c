/* Credit flow control (src/cm/flow.c): the rules flow.h states, as the
 * connection's files use them, and a broken rule caught in code. */
#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cm/flow.h"

static struct mw__flow flow(unsigned limit, unsigned own)
{
    struct mw__flow fl;
    mw__flow_init(&fl, NULL, limit, own);
    return fl;
}

/* Spend data until it may not go: the last credit stays. */
static void data_never_takes_the_last_credit(void **state)
{
    (void)state;
    struct mw__flow fl = flow(4, 4);
    unsigned sent = 0;
    while (mw__flow_data_ok(&fl)) {
        mw__flow_frag_sent(&fl, mw__flow_to_give(&fl), true);
        sent++;
    }
    assert_int_equal(sent, 3);
    assert_int_equal(fl.credits, 1);
    mw__flow_imm_sent(&(struct mw__flow){.limit = 2, .own = 2, .credits = 2});
}

/* The reserve lets owed credits go alone, and their fragment carries them. */
static void the_reserve_carries_owed_credits_alone(void **state)
{
    (void)state;
    struct mw__flow fl = flow(8, 8);
    for (int i = 0; i < 7; i++)
        mw__flow_frag_sent(&fl, 0, true);
    assert_false(mw__flow_data_ok(&fl));
    for (int i = 0; i < 4; i++)
        mw__flow_slot_reposted(&fl);
    assert_true(mw__flow_return_due(&fl));      /* half of our slots are owed */
    unsigned give = mw__flow_to_give(&fl);
    assert_int_equal(give, 4);
    mw__flow_frag_sent(&fl, give, false);
    assert_int_equal(fl.credits, 0);
    assert_int_equal(fl.owed, 0);
    assert_false(mw__flow_return_due(&fl));     /* nothing owed, nothing to spend */
}

/* One credit never goes back alone, even waiting: two waiting sides passed
 * single credits back and forth for ever.  Two go when waiting; with fewer
 * than three slots one is half of them. */
static void a_credit_alone_never_goes_back_alone(void **state)
{
    (void)state;
    struct mw__flow fl = flow(8, 8);
    mw__flow_wait(&fl, true);
    mw__flow_slot_reposted(&fl);
    assert_false(mw__flow_return_due(&fl));
    mw__flow_slot_reposted(&fl);
    assert_true(mw__flow_return_due(&fl));
    mw__flow_wait(&fl, false);
    assert_false(mw__flow_return_due(&fl));     /* not waiting: 2 of 8 wait */

    struct mw__flow two = flow(2, 2);
    mw__flow_slot_reposted(&two);
    assert_true(mw__flow_return_due(&two));
}

static void a_peer_returning_more_than_it_got_breaks_the_protocol(void **state)
{
    (void)state;
    struct mw__flow fl = flow(4, 4);
    assert_int_equal(mw__flow_returned(&fl, 1), -EPROTO);
    mw__flow_frag_sent(&fl, 0, true);
    mw__flow_frag_sent(&fl, 0, true);
    assert_int_equal(mw__flow_returned(&fl, 3), -EPROTO);
    assert_int_equal(fl.credits, 2);            /* refused: nothing taken */
    assert_int_equal(mw__flow_returned(&fl, 2), 0);
    assert_int_equal(fl.credits, 4);
}

/* A wait begins once; credits returned start it over; past its time it
 * ends once. */
static void a_credit_wait_begins_once_and_expires_once(void **state)
{
    (void)state;
    struct mw__flow fl = flow(4, 4);
    assert_false(mw__flow_wait_expired(&fl, 0));        /* not waiting */
    assert_true(mw__flow_wait(&fl, true));
    assert_false(mw__flow_wait(&fl, true));
    assert_false(mw__flow_wait_expired(&fl, 60000));
    uint64_t began = fl.wait_since;
    usleep(20000);
    mw__flow_frag_sent(&fl, 0, true);
    assert_int_equal(mw__flow_returned(&fl, 1), 0);
    assert_true(fl.wait_since >= began + 15);           /* started over */
    assert_true(mw__flow_wait_expired(&fl, 0));
    assert_int_equal(fl.wait_since, 0);
    assert_false(mw__flow_wait_expired(&fl, 0));
}

static void parked_slots_come_back_one_by_one(void **state)
{
    (void)state;
    struct mw__flow fl = flow(2, 3);
    mw__flow_slot_parked(&fl);
    mw__flow_slot_parked(&fl);
    mw__flow_slot_reposted(&fl);
    assert_int_equal(fl.parked + fl.owed, 3);
    mw__flow_slot_unparked(&fl);
    mw__flow_slot_reposted(&fl);
    assert_int_equal(fl.parked, 1);
    assert_int_equal(fl.owed, 2);
}

static void spend_the_last_credit_on_data(void)
{
    struct mw__flow fl = flow(1, 4);
    mw__flow_frag_sent(&fl, 0, true);
}

static void return_one_credit_alone(void)
{
    struct mw__flow fl = flow(4, 8);
    mw__flow_slot_reposted(&fl);
    mw__flow_frag_sent(&fl, 1, false);
}

static void owe_more_slots_than_we_have(void)
{
    struct mw__flow fl = flow(4, 1);
    mw__flow_slot_parked(&fl);
    mw__flow_slot_reposted(&fl);
}

static void spend_an_immediate_on_the_last_credit(void)
{
    struct mw__flow fl = flow(1, 1);
    mw__flow_imm_sent(&fl);
}

/* @breaker breaks a rule, in a child: a debug build stops there (a release
 * build logs it and goes on: convention 9). */
static void dies_in_child(void (*breaker)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(STDERR_FILENO);     /* the assertion's message is expected */
        breaker();
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
#ifdef NDEBUG
    assert_true(WIFEXITED(status));   /* logged, went on */
#else
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
#endif
}

static void a_broken_rule_is_caught_where_it_breaks(void **state)
{
    (void)state;
    dies_in_child(spend_the_last_credit_on_data);
    dies_in_child(return_one_credit_alone);
    dies_in_child(owe_more_slots_than_we_have);
    dies_in_child(spend_an_immediate_on_the_last_credit);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(data_never_takes_the_last_credit),
        cmocka_unit_test(the_reserve_carries_owed_credits_alone),
        cmocka_unit_test(a_credit_alone_never_goes_back_alone),
        cmocka_unit_test(a_peer_returning_more_than_it_got_breaks_the_protocol),
        cmocka_unit_test(a_credit_wait_begins_once_and_expires_once),
        cmocka_unit_test(parked_slots_come_back_one_by_one),
        cmocka_unit_test(a_broken_rule_is_caught_where_it_breaks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
