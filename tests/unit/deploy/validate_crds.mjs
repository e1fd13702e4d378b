// Validates custom resources against validators generated from their upstream CRDs
// (@kubernetes-models/keda, @kubernetes-models/prometheus-operator; scripts/install_tools.sh puts
// them in .tools/). Usage: node validate_crds.mjs NODE_MODULES < objects.json
// stdin: a JSON list of objects; stdout: a JSON list with one error message ("" = valid) each.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const modules = process.argv[2];
const classes = {
  "keda.sh/v1alpha1 ScaledObject": "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject.js",
  "monitoring.coreos.com/v1 ServiceMonitor":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js",
  "monitoring.coreos.com/v1 PrometheusRule":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule.js",
};
const results = [];
for (const obj of JSON.parse(readFileSync(0, "utf8"))) {
  const key = `${obj.apiVersion} ${obj.kind}`;
  const path = classes[key];
  if (path === undefined) {
    results.push(`no validator for ${key}`);
    continue;
  }
  const module = await import(pathToFileURL(`${modules}/${path}`).href);
  try {
    new module[obj.kind](obj).validate();
    results.push("");
  } catch (error) {
    results.push(String(error.message ?? error));
  }
}
console.log(JSON.stringify(results));
