/* Unit tests of the plugin's pure core (no Slurm needed). */
#include "check.h"

int sattr_t_pass, sattr_t_fail;

void test_args(void);
void test_envplan(void);
void test_jobdir(void);
void test_watcher(void);

int main(void)
{
	test_args();
	test_envplan();
	test_jobdir();
	test_watcher();
	return sattr_t_report();
}
