/* A program that embeds Python (Py_Initialize, as an application with a
 * scripting layer would) and runs the code given as its argument, to show
 * that meshwire imports there as it does in python3.
 *   embed-python CODE        exit status 0 when CODE ran without an exception */
#include <Python.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CODE\n", argv[0]);
        return 2;
    }
    Py_Initialize();
    int rc = PyRun_SimpleString(argv[1]);   /* prints its own traceback */
    if (Py_FinalizeEx() < 0)
        rc = -1;
    return rc ? 1 : 0;
}
