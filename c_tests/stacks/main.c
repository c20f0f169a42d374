/* The program of the three builds of paths.c: runs every path once. */
#include "paths.h"

int main(void)
{
    sp_run();
    SP_BARRIER();
    return 0;
}
