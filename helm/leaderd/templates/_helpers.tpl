{{/*
Names and labels.
*/}}
{{- define "leaderd.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "leaderd.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- /* The image, repository:tag; no image is published, so the repository
is the user's to name. */ -}}
{{- define "leaderd.image" -}}
{{- $repo := required "image.repository must name where your cluster pulls leaderd's image from: none is published (push the release's OCI archive to your registry; docs/kubernetes.md, The image)" .Values.image.repository -}}
{{- printf "%s:%s" $repo .Values.image.tag -}}
{{- end -}}

{{- define "leaderd.secretName" -}}
{{- required "database.existingSecret must name the Secret holding the database URL" .Values.database.existingSecret -}}
{{- end -}}

{{/*
The sidecar container, for a pod's initContainers (a native sidecar:
restartPolicy Always, Kubernetes 1.29+). It stops after the app containers,
so the lease is held through the app's shutdown.
Usage, from a parent chart that has this one as a dependency:
       initContainers:
         {{- include "leaderd.sidecar" .Subcharts.leaderd | nindent 8 }}
*/}}
{{- define "leaderd.sidecar" -}}
- name: leaderd
  image: {{ include "leaderd.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  restartPolicy: Always
  args: ["run"]
  env:
    {{- if eq .Values.idSource "podName" }}
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    {{- end }}
    {{- if .Values.elections }}
    - name: LEADERD_ELECTIONS
      value: {{ join "," .Values.elections | quote }}
    - name: LEADERD_SPREAD
      value: {{ .Values.spread | quote }}
    - name: LEADERD_ELECTION_METRICS
      value: {{ .Values.electionMetrics | quote }}
    {{- else }}
    - name: LEADERD_ELECTION
      value: {{ .Values.election | quote }}
    {{- end }}
    - name: LEADERD_DATABASE_URL_FILE
      value: /var/run/secrets/leaderd/{{ .Values.database.secretKey }}
    - name: LEADERD_LISTEN
      value: {{ .Values.listen | quote }}
    - name: LEADERD_PRIORITY
      value: {{ .Values.priority | quote }}
    {{- with .Values.advertise }}
    {{- if or .value .port }}
    # Defined before LEADERD_ADVERTISE: Kubernetes expands $(POD_IP) only
    # from variables defined earlier in the list.
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: LEADERD_ADVERTISE
      value: {{ .value | default (printf "%s://$(POD_IP):%v" .scheme .port) | quote }}
    {{- end }}
    {{- end }}
    - name: LEADERD_HEARTBEAT
      value: {{ .Values.heartbeat | quote }}
    - name: LEADERD_TTL
      value: {{ .Values.ttl | quote }}
    - name: LEADERD_LOG_FORMAT
      value: {{ .Values.logFormat | quote }}
    - name: LEADERD_MIGRATE
      value: {{ (not .Values.migration.enabled) | quote }}
    {{- if .Values.flagFile.enabled }}
    - name: LEADERD_FLAG_FILE
      value: {{ .Values.flagFile.path | quote }}
    {{- end }}
  ports:
    - name: leaderd
      containerPort: {{ .Values.port }}
  {{- if .Values.startupProbe.enabled }}
  # The app's containers start once this passes: a new pod is a candidate
  # to be named before it can be Ready.
  startupProbe:
    httpGet:
      path: /readyz
      port: leaderd
    periodSeconds: {{ .Values.startupProbe.periodSeconds }}
    failureThreshold: {{ .Values.startupProbe.failureThreshold }}
  {{- end }}
  {{- if .Values.readinessProbe.enabled }}
  # Ready while the database answers, leader or not, competing or not.
  readinessProbe:
    httpGet:
      path: /readyz
      port: leaderd
    periodSeconds: {{ .Values.readinessProbe.periodSeconds }}
    failureThreshold: {{ .Values.readinessProbe.failureThreshold }}
  {{- end }}
  {{- if .Values.livenessProbe.enabled }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: leaderd
    periodSeconds: {{ .Values.livenessProbe.periodSeconds }}
    failureThreshold: {{ .Values.livenessProbe.failureThreshold }}
  {{- end }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: leaderd-db
      mountPath: /var/run/secrets/leaderd
      readOnly: true
    {{- if .Values.database.ca.existingSecret }}
    - name: leaderd-db-ca
      mountPath: {{ .Values.database.ca.mountPath }}
      readOnly: true
    {{- end }}
    {{- if .Values.flagFile.enabled }}
    - name: {{ .Values.flagFile.volumeName }}
      mountPath: {{ dir .Values.flagFile.path }}
    {{- end }}
{{- end -}}

{{/*
The volumes the sidecar needs, for the pod's volumes list.
*/}}
{{- define "leaderd.volumes" -}}
- name: leaderd-db
  secret:
    secretName: {{ include "leaderd.secretName" . }}
{{- if .Values.database.ca.existingSecret }}
- name: leaderd-db-ca
  secret:
    secretName: {{ .Values.database.ca.existingSecret }}
    items:
      - key: {{ .Values.database.ca.secretKey }}
        path: {{ .Values.database.ca.secretKey }}
{{- end }}
{{- if .Values.flagFile.enabled }}
- name: {{ .Values.flagFile.volumeName }}
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- end -}}

{{/*
A readiness probe for the app container: Ready only while this replica
leads, so a Service routes to the leader alone.
*/}}
{{/*
The app container's lifecycle: hand leadership over before the app drains.
The release names the successor (the live replica with the highest
priority that started last: in a rolling update a new pod), and the hold
drains this replica: nothing moves to it again, and the spread gives it
nothing. So a rolling update moves each election once
(docs/kubernetes.md).
Needs the leaderd binary in the app image (COPY --from the leaderd image).
Given the sidecar's listen address, `leaderd release` finds its loopback-only
release listener (127.0.0.1:4041 beside 0.0.0.0:4040). The hold is
releaseOnStopHold. Include it under `lifecycle:` (it is the whole `preStop:`
entry):
  lifecycle:
    {{- include "leaderd.releaseOnStop" .Subcharts.leaderd | nindent 4 }}
*/}}
{{- define "leaderd.releaseOnStop" -}}
preStop:
  exec:
    command: ["/usr/local/bin/leaderd", "release", "--listen", {{ .Values.listen | quote }}, "--hold", {{ .Values.releaseOnStopHold | quote }}]
{{- end -}}

{{- define "leaderd.leaderReadinessProbe" -}}
httpGet:
  path: /leader
  port: {{ .Values.port }}
periodSeconds: 2
failureThreshold: 1
{{- end -}}
