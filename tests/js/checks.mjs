// The runner both check scripts share: register checks, run them in order, print one
// `ok - name` or `not ok - name` line each, exit non-zero if any failed.
const checks = [];

export const check = (name, fn) => checks.push([name, fn]);

export async function runChecks() {
  let failed = 0;
  for (const [name, fn] of checks) {
    try {
      await fn();
      console.log(`ok - ${name}`);
    } catch (error) {
      failed += 1;
      console.log(`not ok - ${name}\n${error?.stack ?? error}`);
    }
  }
  process.exit(failed ? 1 : 0);
}
